"""The ask router: ``agent.asked`` / ``agent.replied`` and wait timeouts into routed facts (COL-2..COL-9).

Handlers for ``CONSUMERS["agent-collab-asks"]`` (:meth:`AskRouter.handle`) and
``CONSUMERS["agent-collab-ask-timers"]`` (:meth:`AskRouter.handle_timer`, a raw handler: the timer
payload ``{"request_id": ...}``). Every step is *record first, then effects*: the decision is written
to ``ask.<request_id>`` (create-if-absent or compare-and-set, first writer wins), then the events
(deterministic ids), relay run and timer that follow from the stored record are published. A crash in
between is repaired by the redelivery, which finds the record and republishes the same facts;
JetStream's duplicate window and the journal drop the copies. Returning acks.

An ask is resolved against the saga projection that ``agent-collab-runs`` keeps. Both consumers read
the same stream at their own pace, so before resolving (or judging whether an asker has finished) the
router waits, briefly, until that projection has handled every lifecycle event published before the
ask (:meth:`AskRouter._projected`); a projection still behind after that is a transient failure (nak
with backoff), never a wrong "unknown addressee".

A relay run that ends (``agent-collab-runs`` calls :meth:`AskRouter.on_run_event`) is judged by a
timer a moment later, once the asks consumer has handled everything before the run's end: no reply by
then is ``agent.ask_undeliverable`` (``relay_failed``). The waits only ever point one way (timers ->
asks -> projection), so no two consumers wait on each other.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_agent_collab.asks import (
    AskRecord,
    Relay,
    RelayIndex,
    ReplyRefusal,
    Undeliverable,
    answer_received_event,
    ask_key,
    expired_event,
    message_received_event,
    new_record,
    parse_relay_run,
    relay_index_key,
    relay_requested_event,
    reply_undeliverable_event,
    resolve,
    routing_failed_event,
    undeliverable_event,
)
from temporality_agent_collab.participants import (
    InvalidKey,
    RunIndex,
    SagaParticipants,
    run_key,
    run_of,
    saga_key,
)
from temporality_bus import AlreadyExists, Bus, Delivery, NotFound, PermanentError, Store, Timers, TransientError
from temporality_protocol import (
    RUN,
    AgentAsked,
    AgentReplied,
    Envelope,
    InvalidEnvelope,
    RunCancelled,
    RunCompleted,
    RunFailed,
    derive_id,
)
from temporality_protocol.catalog import BUCKET_COLLAB, EVENTS_STREAM, TIMER_NS_AGENT_ASK
from temporality_protocol.states import AgentAskState

__all__ = ["ASKS_CONSUMER", "PROJECTION_CONSUMER", "RELAY_END_GRACE", "AskRouter", "TimerPayload", "timer_payload"]

log = structlog.get_logger(__name__)

#: The consumer whose projection asks are resolved against.
PROJECTION_CONSUMER = "agent-collab-runs"
#: The consumer routing replies: a relay run's end is judged once it has handled what came before.
ASKS_CONSUMER = "agent-collab-asks"
#: A relay run that ended is judged (did it answer?) by a timer this much later, never inline (see
#: :meth:`AskRouter.relay_ended`).
RELAY_END_GRACE = timedelta(seconds=1)
#: How long a handler waits for the projection to catch up before handing the message back (nak).
CATCH_UP_S = 3.0
_POLL_S = 0.05
#: The request is still open with its recipient in these states (a reply settles it).
_OPEN = frozenset({AgentAskState.DELIVERED, AgentAskState.EXPIRED})
_ENDED = frozenset({RunCompleted.EVENT_TYPE, RunFailed.EVENT_TYPE, RunCancelled.EVENT_TYPE})


def _utcnow() -> datetime:
    return datetime.now(UTC)


class TimerPayload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_=-]+$")]
    #: A relay-end check: the stream sequence of the relay run's terminal event (absent: the wait timeout).
    relay_ended_seq: Annotated[int, Field(gt=0)] | None = None


def timer_payload(request_id: str, *, relay_ended_seq: int | None = None) -> bytes:
    body: dict[str, object] = {"request_id": request_id}
    if relay_ended_seq is not None:
        body["relay_ended_seq"] = relay_ended_seq
    return json.dumps(body).encode()


class _AskAddress(BaseModel):
    """What an unreadable ``agent.asked`` must still carry for its asker to be told: who asked, which request."""

    model_config = ConfigDict(extra="ignore")

    request_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_=-]+$", max_length=200)]
    asker_run_id: Annotated[str, Field(min_length=1, max_length=200)]
    to: Annotated[str, Field(max_length=500)] = ""


#: ``detail`` of ``routing_failed``: what the asker's tool result shows (the error itself goes to the journal).
_DETAIL_MAX = 500


def relay_end_key(request_id: str) -> str:
    return f"{request_id}.relay"


class AskRouter:
    """Routes asks and replies. Build with :meth:`open`; pass :meth:`handle` and :meth:`handle_timer` to consumers."""

    def __init__(
        self,
        bus: Bus,
        asks: Store[AskRecord],
        relays: Store[RelayIndex],
        sagas: Store[SagaParticipants],
        index: Store[RunIndex],
    ) -> None:
        self._bus = bus
        self._asks = asks
        self._relays = relays
        self._sagas = sagas
        self._index = index
        self.timers = Timers(bus, TIMER_NS_AGENT_ASK)

    @classmethod
    async def open(cls, bus: Bus) -> AskRouter:
        return cls(
            bus,
            await bus.store(BUCKET_COLLAB, AskRecord),
            await bus.store(BUCKET_COLLAB, RelayIndex),
            await bus.store(BUCKET_COLLAB, SagaParticipants),
            await bus.store(BUCKET_COLLAB, RunIndex),
        )

    # ------------------------------------------------------------------ consumer entry points
    async def handle(self, event: Envelope, delivery: Delivery) -> None:
        """``agent.asked`` or ``agent.replied``; anything else is a routing error (dead-lettered)."""
        try:
            if event.type == AgentAsked.EVENT_TYPE:
                asked = event.payload(AgentAsked)
                with structlog.contextvars.bound_contextvars(request_id=asked.request_id):
                    await self.ask(asked, event, delivery.stream_seq)
            elif event.type == AgentReplied.EVENT_TYPE:
                replied = event.payload(AgentReplied)
                with structlog.contextvars.bound_contextvars(request_id=replied.request_id):
                    await self.reply(replied, event, delivery.stream_seq)
            else:
                raise PermanentError(f"agent-collab-asks does not handle {event.type}")
        except InvalidKey as exc:
            raise PermanentError(str(exc)) from exc

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        """The asks consumer gives an ``agent.asked`` up (its data unreadable, or every delivery spent): the
        asker is told, ``agent.ask_undeliverable`` (``routing_failed``), so a ``wait`` asker does not stay
        parked (its watchdog is disarmed and the ask's timeout timer is armed only once the ask is routed).

        An ask already decided (a record stored) has its routing republished instead: the decision stands.
        Anything else (``agent.replied``, bytes with no envelope, an ask naming no request) has nobody to tell
        and is only dead-lettered and journaled. A failure to publish raises: the runner hands the message
        back and gives it up again later, so the asker is told at least once.
        """
        if not isinstance(message, Envelope) or message.type != AgentAsked.EVENT_TYPE:
            return
        try:
            address = _AskAddress.model_validate(message.data)
            key = ask_key(address.request_id)
        except (ValidationError, InvalidKey) as exc:
            log.error("ask.dead_lettered_unaddressable", event_id=message.id, error=repr(exc)[:300])
            return
        with structlog.contextvars.bound_contextvars(request_id=address.request_id):
            found = await self._asks.get(key)
            if found is not None:
                await self._publish_routing(found.value)
                return
            try:
                asked = message.payload(AgentAsked)
            except InvalidEnvelope:
                detail = "agent-collab could not read the ask (its data fails the agent.asked schema)"
            else:
                detail = f"agent-collab gave the ask up after {delivery.num_delivered} deliveries: {error}"
                saga_id = message.correlationid or asked.asker_run_id
                record = new_record(asked, message, saga_id, Undeliverable("routing_failed", detail[:_DETAIL_MAX]), 0)
                try:
                    await self._asks.create(key, record)
                except AlreadyExists:
                    found = await self._asks.get(key)
                    if found is not None:
                        await self._publish_routing(found.value)
                        return
                await self._publish_routing(record)
                log.warning("ask.undeliverable", reason="routing_failed", error=repr(error)[:300])
                return
            await self._bus.publish(
                routing_failed_event(message, address.request_id, address.asker_run_id, address.to[:500], detail)
            )
            log.warning("ask.undeliverable", reason="routing_failed", error=repr(error)[:300])

    async def handle_timer(self, data: bytes, delivery: Delivery | None = None) -> None:
        """An ``agent-ask`` timer fired: a wait-mode timeout (``agent.ask_expired`` if still unanswered), or
        the check of a relay run that ended (``relay_ended_seq`` in the payload, see :meth:`judge_relay`)."""
        try:
            payload = TimerPayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable ask timer payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id):
            if payload.relay_ended_seq is not None:
                await self.judge_relay(payload.request_id, payload.relay_ended_seq)
            else:
                await self.expire(payload.request_id, delivery)

    # ------------------------------------------------------------------ agent.asked
    async def ask(self, asked: AgentAsked, event: Envelope, seq: int) -> AskRecord:
        key = ask_key(asked.request_id)
        found = await self._asks.get(key)
        if found is None:
            await self._projected(seq)
            saga = await self._saga_of(asked.asker_run_id)
            resolution = resolve(asked, saga)
            number = 0
            if isinstance(resolution, Relay):
                number = await self._relay_number(resolution.run_id, asked.request_id)
            saga_id = saga.saga_id if saga is not None else (event.correlationid or asked.asker_run_id)
            record = new_record(asked, event, saga_id, resolution, number)
            try:
                await self._asks.create(key, record)
            except AlreadyExists:
                found = await self._asks.get(key)  # another replica (or our earlier attempt) decided first
                if found is None:  # pragma: no cover - ask records are never deleted
                    raise TransientError(f"ask record {key} vanished") from None
                record = found.value
            else:
                outcome = "relayed" if record.relay else "delivered"
                if isinstance(resolution, Undeliverable):
                    outcome = resolution.reason
                log.info("ask.routed", outcome=outcome, recipient=record.recipient_run_id, asker=asked.asker_run_id)
        else:
            record = found.value
            log.info("ask.seen_again", state=record.state.value)
        await self._publish_routing(record)
        return record

    async def _relay_number(self, target_run_id: str, request_id: str) -> int:
        """This request's relay number for ``target_run_id`` (appended once: a redelivery gets the same)."""
        result = await self._relays.modify(
            relay_index_key(target_run_id),
            lambda idx: (
                None if request_id in idx.request_ids else RelayIndex(request_ids=[*idx.request_ids, request_id])
            ),
            create=RelayIndex,
            attempts=16,
        )
        return result.value.request_ids.index(request_id) + 1

    async def _publish_routing(self, record: AskRecord) -> None:
        """The effects of a routing decision, from the record: republished as long as it stands there."""
        if record.state is AgentAskState.UNDELIVERABLE and record.recipient_run_id is None:
            await self._bus.publish(undeliverable_event(record))
            return
        if record.state is not AgentAskState.DELIVERED:
            return  # it has moved on (expired, answered): its routing was published long ago
        if record.relay:
            await self._bus.publish(relay_requested_event(record))
        if record.mode == "wait" and record.expires_at is not None:
            await self.timers.arm(
                record.request_id,
                record.expires_at,
                timer_payload(record.request_id),
                msg_id=derive_id("tmr", record.request_id),
            )
        await self._bus.publish(message_received_event(record))

    # ------------------------------------------------------------------ agent.replied
    async def reply(self, replied: AgentReplied, event: Envelope, seq: int) -> None:
        found = await self._asks.get(ask_key(replied.request_id))
        if found is None:
            await self._refuse(replied, event, "unknown_request", f"no request {replied.request_id} was routed", None)
            return
        record = found.value
        if record.recipient_run_id != replied.replier_run_id:
            detail = f"request {replied.request_id} was not sent to run {replied.replier_run_id}"
            await self._refuse(replied, event, "not_received", detail, record)
            return
        await self._projected(seq)
        asker_live = await self._is_live(record.asker_run_id)

        def settle(current: AskRecord) -> AskRecord | None:
            if current.reply_event_id is not None or current.state not in _OPEN:
                return None  # already settled (by this reply: a redelivery; or by another: refused below)
            fields = {
                "reply_event_id": event.id,
                "replier_run_id": replied.replier_run_id,
                "replier_agent": replied.replier_agent,
                "outcome": replied.outcome,
                "answer": replied.answer,
                "answer_truncated": replied.truncated,
                "replied_at": event.time,
            }
            if not asker_live:
                return current.moved_to(AgentAskState.REPLY_UNDELIVERABLE, **fields)
            target = AgentAskState.ANSWERED if replied.outcome == "answer" else AgentAskState.REFUSED
            return current.moved_to(target, **fields)

        settled = (await self._asks.modify(ask_key(replied.request_id), settle)).value
        if settled.reply_event_id != event.id:
            if settled.reply_event_id is not None:
                detail = f"request {replied.request_id} was already answered"
                await self._refuse(replied, event, "already_answered", detail, settled)
            else:
                detail = f"request {replied.request_id} is closed ({settled.state.value})"
                await self._refuse(replied, event, "request_closed", detail, settled)
            return
        if settled.mode == "wait":
            await self.timers.cancel(settled.request_id)  # the firing would find it settled anyway
        if settled.state is AgentAskState.REPLY_UNDELIVERABLE:
            detail = f"run {settled.asker_run_id} has finished: the reply is journaled, there is nowhere to deliver it"
            await self._refuse(replied, event, "asker_finished", detail, settled)
            return
        await self._bus.publish(answer_received_event(settled))
        log.info("reply.routed", outcome=settled.outcome, late=settled.expired_at is not None)

    async def _refuse(
        self, replied: AgentReplied, event: Envelope, reason: ReplyRefusal, detail: str, record: AskRecord | None
    ) -> None:
        await self._bus.publish(reply_undeliverable_event(replied, event, reason, detail, record))
        log.info("reply.undeliverable", reason=reason, replier=replied.replier_run_id)

    # ------------------------------------------------------------------ timers
    async def expire(self, request_id: str, delivery: Delivery | None) -> None:
        key = ask_key(request_id)
        found = await self._asks.get(key)
        if found is None:
            raise PermanentError(f"an ask timer fired for {request_id}, which is not a known request")
        record = found.value
        if record.mode != "wait" or record.expires_at is None or record.state not in _OPEN:
            log.info("ask_timer.ignored", state=record.state.value)
            return
        if record.state is AgentAskState.DELIVERED:
            now = _utcnow()
            if now < record.expires_at:  # a schedule fired early: never expire early, arm it again
                cause = f"seq:{delivery.stream_seq}" if delivery is not None else now.isoformat()
                await self.timers.rearm(
                    request_id,
                    record.expires_at,
                    timer_payload(request_id),
                    msg_id=derive_id("tmr", request_id, "rearm", cause),
                )
                log.warning("ask_timer.fired_early", expires_at=record.expires_at.isoformat())
                return
            if not await self._is_live(record.asker_run_id):
                log.info("ask_timer.asker_finished", asker=record.asker_run_id)
                return
            expires_at = record.expires_at

            def expire(current: AskRecord) -> AskRecord | None:
                if current.state is not AgentAskState.DELIVERED:
                    return None
                return current.moved_to(AgentAskState.EXPIRED, expired_at=expires_at)

            record = (await self._asks.modify(key, expire)).value
        if record.state is AgentAskState.EXPIRED:
            await self._bus.publish(expired_event(record))
            log.info("ask.expired", asker=record.asker_run_id, recipient=record.recipient_run_id)

    # ------------------------------------------------------------------ relay runs ending
    async def on_run_event(self, event: Envelope, delivery: Delivery) -> None:
        """After the projector handled a lifecycle event: a relay run's end is checked for an answer."""
        if event.type not in _ENDED:
            return
        try:
            await self.relay_ended(run_of(event), delivery.stream_seq)
        except InvalidKey as exc:
            raise PermanentError(str(exc)) from exc

    async def relay_ended(self, run_id: str, seq: int) -> None:
        """A relay run ended (``agent-collab-runs``): judge, a little later, whether it answered.

        Not inline: its ``agent.replied`` comes just before its end in the stream, but on another
        consumer that may not have handled it yet, and the projection consumer must never wait on the
        asks consumer (which waits on it). The timer's handler waits for the asks consumer instead.
        """
        parsed = parse_relay_run(run_id)
        if parsed is None:
            return
        target, number = parsed
        index = await self._relays.get(relay_index_key(target))
        if index is None or len(index.value.request_ids) < number:
            log.info("relay.unknown_run_ended", run_id=run_id)
            return
        request_id = index.value.request_ids[number - 1]
        found = await self._asks.get(ask_key(request_id))
        if found is None or found.value.recipient_run_id != run_id or found.value.state not in _OPEN:
            return
        await self.timers.arm(
            relay_end_key(request_id),
            _utcnow() + RELAY_END_GRACE,
            timer_payload(request_id, relay_ended_seq=seq),
            msg_id=derive_id("tmr", request_id, "relay-end"),
        )
        log.info("relay.ended", run_id=run_id, request_id=request_id)

    async def judge_relay(self, request_id: str, ended_seq: int) -> None:
        """The relay run ended at stream sequence ``ended_seq``: no reply by then is ``relay_failed`` (COL-9)."""
        await self._caught_up(ASKS_CONSUMER, ended_seq)
        key = ask_key(request_id)

        def fail(current: AskRecord) -> AskRecord | None:
            if current.state not in _OPEN or current.reply_event_id is not None or not current.relay:
                return None
            detail = f"the relay run {current.relay_run} ended without answering"
            return current.moved_to(AgentAskState.UNDELIVERABLE, reason="relay_failed", detail=detail)

        try:
            record = (await self._asks.modify(key, fail)).value
        except NotFound:
            raise PermanentError(f"a relay timer fired for {request_id}, which is not a known request") from None
        if record.state is not AgentAskState.UNDELIVERABLE:
            log.info("relay.answered", state=record.state.value)
            return
        if record.mode == "wait":
            await self.timers.cancel(request_id)
        await self._bus.publish(undeliverable_event(record))
        log.info("ask.undeliverable", reason="relay_failed", relay_run=record.relay_run)

    # ------------------------------------------------------------------ the saga projection
    async def _saga_of(self, run_id: str) -> SagaParticipants | None:
        found = await self._index.get(run_key(run_id))
        if found is None:
            return None
        saga = await self._sagas.get(saga_key(found.value.saga_id))
        return saga.value if saga is not None else None

    async def _is_live(self, run_id: str) -> bool:
        """The run has not finished as far as the projection knows (an unknown run counts as finished)."""
        saga = await self._saga_of(run_id)
        if saga is None or run_id not in saga.runs:
            return False
        return saga.runs[run_id].status not in RUN.terminal

    async def _projected(self, seq: int) -> None:
        """Wait until the saga projection has handled every lifecycle event before stream sequence ``seq``."""
        await self._caught_up(PROJECTION_CONSUMER, seq)

    async def _caught_up(self, durable: str, seq: int) -> None:
        """Wait until consumer ``durable`` has handled all its messages before stream sequence ``seq``.

        Its ack floor past ``seq - 1``, or nothing pending or in flight at all (the floor only moves on
        acks, so an idle consumer's floor can sit below messages it never had to see). Still behind after
        :data:`CATCH_UP_S`: a :class:`TransientError` (the runner naks with backoff).
        """
        if seq <= 0:
            return
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            try:
                info = await self._bus.js.consumer_info(EVENTS_STREAM.name, durable)
            except Exception as exc:  # the consumer not there yet, the server away: retried by the runner
                raise TransientError(f"reading {durable}'s position failed: {exc!r}") from exc
            floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
            if (floor or 0) >= seq - 1 or (info.num_pending == 0 and info.num_ack_pending == 0):
                return
            if time.monotonic() > deadline:
                raise TransientError(f"{durable} is behind stream sequence {seq}")
            await asyncio.sleep(_POLL_S)  # a short poll on the consumer's position, not a deadline
