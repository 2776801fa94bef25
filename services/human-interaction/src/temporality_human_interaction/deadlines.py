"""Timers firing: the timeout policy's chain and expiry (HUM-8); a lost answer is announced.

Run by :class:`temporality_bus.Consumer` on ``CONSUMERS["human-interaction-deadlines"]`` as a raw
handler: the message is the timer payload ``{"request_id": ...}`` that a JetStream message schedule
published (the deadline, or an answer's repair timer, see :mod:`.timers`). What happens depends on
the record alone, never on which timer fired:

* **pending, ``expires_at`` passed**: CAS to ``expired`` first; ``human.expired`` is published after
  it and ``expiry_published`` records that, so a crash in between is repaired by the redelivery. With
  the policy's terminal ``cancel``, ``run.cancel_requested`` (reason ``human_timeout: …``) is published
  first, then ``human.expired`` (``action: cancel``), so the run-executor cancels the parked run.
  Then every sent copy of the question is edited to say it expired (``on_outcome``, best effort).
* **pending, before ``expires_at``, a chain step's timer** (payload ``step``, HUM-8): the step is taken
  by :class:`~.chain.ChainRunner` if ``chain_done`` is at it and it is due (a reminder, the escalation);
  a stale firing (the step already happened) does nothing, an early one re-arms the step's timer.
* **pending, before ``expires_at``** (a timer fired early): nothing expires; the deadline is armed
  again at ``expires_at`` so the request still expires on time.
* **answered, ``answer_published`` false** (the publish after the answer's CAS was lost): the stored
  answer's ``human.answered`` is published (same deterministic id) and marked published.
* anything else (answered and announced, cancelled) is left alone.

A parked request's timers (payload ``parked``, :mod:`.parking`: not stored yet, waiting for its run's policy)
go to ``RequestHandler.resume_parked``: the policy's arrival takes it in, its deadline refuses it if the
policy is still unknown.

**A kind of timer this version does not know** (a rolling upgrade: a newer replica armed it, this older one
was handed its firing). Each kind fires on its own subject, ``…fired.human.<request id>[.<kind>]``
(:data:`KNOWN_KINDS`: the deadline, ``repair``, ``chain``, ``policy``, ``policywake``). A firing whose subject
is well formed but names a kind this replica does not know is not guessed at and not dead-lettered: it is
armed again, unchanged, onto the same subject ``defer_unknown_s`` later (schedule key
``<key>.deferred``, msg id keyed by the firing's stream sequence, so a redelivery defers it once) and
acked. Each deferral is a fresh message on the shared durable consumer, so no delivery budget runs out: it
comes back until a replica that knows the kind takes it, which is any replica once the upgrade is done.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import Bus, Delivery, NotFound, PermanentError, TransientError, evolve
from temporality_bus.tracing import continued
from temporality_human_interaction.answers import announce_answer, unannounced
from temporality_human_interaction.chain import ChainRunner, plan
from temporality_human_interaction.events import cancel_requested_event, expired_event
from temporality_human_interaction.inbox import RetentionSweeper, is_sweep, unindex
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.records import (
    REQUEST_ID_PATTERN,
    HumanRequestRecord,
    RequestStore,
    is_request_id,
    open_store,
)
from temporality_human_interaction.timers import arm_chain_step, human_timers, rearm_deadline
from temporality_protocol import HumanRequestState, derive_id

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import RequestObserver

__all__ = ["DEFER_UNKNOWN_S", "KNOWN_KINDS", "DeadlineHandler", "DeadlinePayload", "timer_kind"]

log = structlog.get_logger(__name__)

#: A re-armed deadline is set at least this far after the early firing (by this process's clock), so a
#: deadline that fires a moment early is not re-armed for a moment that has already passed.
_REARM_MIN_DELAY = timedelta(seconds=1)


#: The kinds of timer this version handles: the fired key's suffix after the request id ("" is the deadline
#: and its re-arm; see :mod:`.timers` and :mod:`.parking`).
KNOWN_KINDS = frozenset({"", "repair", "chain", "policy", "policywake"})
#: A firing of a kind this version does not know comes back this much later (seconds), for another replica.
DEFER_UNKNOWN_S = 30.0
_KIND = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def timer_kind(key: str) -> str | None:
    """The kind of the fired timer ``key`` (``<request id>[.<kind>]``): ``""`` for the deadline, the suffix
    otherwise; None for a key of another shape (not a request's timer at all)."""
    request_id, _, kind = key.partition(".")
    if not is_request_id(request_id) or (kind and not _KIND.fullmatch(kind)):
        return None
    return kind


class Resume(Protocol):
    """``RequestHandler.resume_parked``."""

    def __call__(self, run_id: str, request_id: str, *, final: bool) -> Awaitable[None]: ...


class DeadlinePayload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: Annotated[str, Field(pattern=REQUEST_ID_PATTERN)]
    #: A chain step's timer (:mod:`.chain`): the step's index; absent for the deadline and repair timers.
    step: Annotated[int, Field(ge=0, le=1000)] | None = None
    #: A parked request's timer (:mod:`.parking`): not stored yet, waiting for its run's policy.
    parked: bool = False
    #: With ``parked``: the run, and whether this is the policy's arrival (else the request's deadline).
    run_id: str | None = None
    wake: bool = False


class DeadlineHandler:
    """The timers' handler; :meth:`handle` is the consumer's raw handler."""

    def __init__(
        self,
        bus: Bus,
        *,
        clock: Callable[[], datetime] | None = None,
        on_outcome: Callable[[HumanRequestRecord], Awaitable[None]] | None = None,
        chain: ChainRunner | None = None,
        sweeper: RetentionSweeper | None = None,
        observer: RequestObserver | None = None,
        resume: Resume | None = None,
        known_kinds: frozenset[str] = KNOWN_KINDS,
        defer_unknown_s: float = DEFER_UNKNOWN_S,
        mirror: ChannelMirror | None = None,
    ) -> None:
        self._bus = bus
        #: ``human-channels`` as this replica's watch sees it (the run entry's mark when a request expires).
        self._mirror = mirror
        #: The timer kinds this handler takes; a firing of another (well-formed) kind is deferred.
        self._known_kinds = known_kinds
        self._defer_unknown_s = defer_unknown_s
        #: Takes a parked request in (``RequestHandler.resume_parked``) when its timer fires (:mod:`.parking`).
        self._resume = resume
        #: Told each request this replica expired (the wait-time histogram).
        self._observer = observer
        #: Purges ended requests past the retention when the sweep's timer fires (:mod:`.inbox`).
        self._sweeper = sweeper
        self._clock = clock or _utcnow
        #: Takes the timeout policy's steps (reminders, escalation); without it a step's firing is only logged.
        self._chain = chain
        #: Shows an expiry on the question's sent copies (``AnswerRouter.show_outcome``); best effort.
        self._on_outcome = on_outcome

    async def handle(self, data: bytes, delivery: Delivery | None = None) -> None:
        if is_sweep(data):
            if self._sweeper is None:
                log.warning("retention.sweep_not_running")
                return
            await self._sweeper.fired()
            return
        if delivery is not None and await self._deferred(data, delivery):
            return
        try:
            payload = DeadlinePayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable deadline payload: {exc}") from exc
        if payload.parked:
            await self._parked(payload)
            return
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id):
            store = await open_store(self._bus)
            record = await self._expire(store, payload.request_id)
            # A timer carries no trace context: its firing continues the one the request was asked in.
            with continued(
                "human.deadline",
                record.traceparent,
                record.tracestate,
                attributes={"temporality.request_id": record.request_id, "temporality.run_id": record.run_id},
            ):
                await self._fired(store, record, payload, delivery)

    async def _deferred(self, data: bytes, delivery: Delivery) -> bool:
        """Whether this firing is of a kind this replica does not know, and was armed again for another."""
        timers = human_timers(self._bus)
        try:
            key = timers.key_of(delivery.subject)
        except ValueError:
            return False  # not a fired human timer's subject: the payload decides (and refuses)
        kind = timer_kind(key)
        if kind is None or kind in self._known_kinds:
            return False
        at = self._clock() + timedelta(seconds=self._defer_unknown_s)
        cause = f"seq:{delivery.stream_seq}" if delivery.stream_seq else at.isoformat()
        result = await timers.arm(
            f"{key}.deferred", at, data, msg_id=derive_id("tmr", key, "deferred", cause), target_key=key
        )
        log.warning(
            "timer.unknown_kind_deferred",
            kind=kind,
            key=key,
            again_at=at.isoformat(),
            duplicate=result.duplicate,
        )
        return True

    async def _parked(self, payload: DeadlinePayload) -> None:
        if payload.run_id is None:
            raise PermanentError(f"a parked request's timer without a run id ({payload.request_id})")
        if self._resume is None:
            log.warning("request.parked_not_running", request_id=payload.request_id)
            raise TransientError("no request intake on this replica to take a parked request in")
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id, run_id=payload.run_id):
            await self._resume(payload.run_id, payload.request_id, final=not payload.wake)

    async def _fired(
        self, store: RequestStore, record: HumanRequestRecord, payload: DeadlinePayload, delivery: Delivery | None
    ) -> None:
        if record.pending:
            if payload.step is not None:
                await self._chain_step(store, record, payload.step, delivery)
            else:
                await self._rearm(record, delivery)
            return
        if unannounced(record):
            log.warning("answer.republishing", trigger="timer", run_id=record.run_id)
            await announce_answer(self._bus, record, store=store)
            return
        if record.status is not HumanRequestState.EXPIRED:
            log.info("deadline.ignored", status=record.status.value)
            return
        if record.expiry_published:
            log.info("deadline.already_announced")
            return
        await unindex(self._bus, record, self._mirror)
        if record.policy.on_timeout.action == "cancel":  # the run-executor cancels the parked run on it
            await self._bus.publish(cancel_requested_event(record))
        await self._bus.publish(expired_event(record, now=record.expires_at))
        await self._mark_published(store, payload.request_id)
        log.info("request.expired", action=record.policy.on_timeout.action, run_id=record.run_id)
        if self._on_outcome is not None:
            await self._on_outcome(record)

    async def _expire(self, store: RequestStore, key: str) -> HumanRequestRecord:
        """Move a pending request past its ``expires_at`` to ``expired``; return the record as it now stands."""

        def expire(record: HumanRequestRecord) -> HumanRequestRecord | None:
            if not record.pending or self._clock() < record.expires_at:
                return None
            return record.moved_to(HumanRequestState.EXPIRED)  # an answer or another replica racing: re-read

        try:
            result = await store.modify(key, expire)
        except NotFound:
            raise PermanentError(f"a deadline fired for {key}, which is not a known request") from None
        if result.changed and self._observer is not None:  # this call's compare-and-set expired it
            self._observer.ended(result.value)
        return result.value

    async def _chain_step(
        self, store: RequestStore, record: HumanRequestRecord, index: int, delivery: Delivery | None
    ) -> None:
        """A chain step's timer fired on a pending request: take the step if it is the next one and due."""
        steps = plan(record)
        step = steps[index] if index < len(steps) else None
        if step is None or record.chain_done != index:
            # done already (a redelivered or duplicated firing), or not the next one: the record decides
            log.info("chain.step_stale", step=index, chain_done=record.chain_done)
            return
        now = self._clock()
        if now < step.at:
            cause = f"seq:{delivery.stream_seq}" if delivery is not None and delivery.stream_seq else now.isoformat()
            at = max(step.at, now + _REARM_MIN_DELAY)
            result = await arm_chain_step(self._bus, record.request_id, index, at, cause=cause)
            log.warning("chain.fired_early", step=index, due=step.at.isoformat(), duplicate=result.duplicate)
            return
        if self._chain is None:
            log.warning("chain.not_running", step=index)
            return
        await self._chain.take(store, record, step)

    async def _rearm(self, record: HumanRequestRecord, delivery: Delivery | None) -> None:
        """A timer fired before ``expires_at``: never expire early, arm the deadline again instead."""
        now = self._clock()
        at = max(record.expires_at, now + _REARM_MIN_DELAY)
        # The firing message keys the new timer: a redelivery of it re-arms once, a later early firing anew.
        cause = f"seq:{delivery.stream_seq}" if delivery is not None and delivery.stream_seq else now.isoformat()
        result = await rearm_deadline(self._bus, record.request_id, at, cause=cause)
        log.warning(
            "deadline.fired_early",
            expires_at=record.expires_at.isoformat(),
            rearmed_at=at.isoformat(),
            subject=delivery.subject if delivery is not None else None,
            duplicate=result.duplicate,
        )

    async def _mark_published(self, store: RequestStore, key: str) -> None:
        try:
            await store.modify(key, lambda r: None if r.expiry_published else evolve(r, expiry_published=True))
        except NotFound:
            return
