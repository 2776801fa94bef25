"""The Agent Protocol for external agents over NATS request/reply (AP-2..AP-4, PRO-2, PRO-3).

Four :class:`temporality_bus.Responder` s in the queue group ``agent-collab`` (N replicas share them)
on the catalogue's subjects, and the handler of the ``agent-heartbeat`` timer firings:

==========================================  ==================================================================
``temporality.rpc.agents.*.register``       allow-list, highest common version, record -> ``agent.registered`` +
                                            ``agent.lifecycle_changed``; else ``agent.registration_refused``
``temporality.rpc.agents.*.heartbeat``      liveness re-armed, the reported state taken (journaled)
``temporality.rpc.agents.*.deregister``     ``decommissioned`` (journaled), liveness timer cancelled
``temporality.rpc.agents.*.list``           the hosted and registered agents' cards; a capability is
                                            ``verified`` only by a passed conformance round (PRO-2)
``temporality.rpc.agents.*.conformance``    the answers to the open conformance round: each probed
                                            capability verified or failed (``agent.conformance_checked``)
timer ``agent-heartbeat.<agent_id>``        no newer heartbeat: ``offline`` (journaled)
timer ``agent-conformance.<agent_id>``      the open round's deadline passed unanswered: ``timeout``
==========================================  ==================================================================

Every step is *record first, then effects*: the decision is committed to KV with
:meth:`~temporality_bus.Store.modify`, then the events of the stored record are published
(deterministic ids) and its timer armed, then the reply sent -- so a reply says the fact is journaled.
A retried request or a redelivered firing finds the record and republishes the same facts, which
JetStream and the journal drop. Every request gets one reply: a malformed one a ``malformed_request``
refusal naming the field, never silence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import structlog
from pydantic import ValidationError

from temporality_agent_collab.conformance import DEFAULT_TIMEOUT_S, challenge
from temporality_agent_collab.conformance import TimerPayload as ConformanceTimer
from temporality_agent_collab.conformance import timer_payload as conformance_timer_payload
from temporality_agent_collab.external import AllowList
from temporality_agent_collab.gate import MessageGate, SignedResponder
from temporality_agent_collab.hints import claimed
from temporality_agent_collab.hosted import HostedAgents
from temporality_agent_collab.registry import (
    AgentRecord,
    Refused,
    TimerPayload,
    agent_key,
    card,
    checked_event,
    conformance_answered,
    conformance_timed_out,
    decommissioned,
    fresh_record,
    heartbeat_missed,
    heartbeat_seen,
    lifecycle_events,
    negotiated,
    operator_decommissioned,
    readmitted,
    readmitted_event,
    refused_event,
    registered,
    registered_event,
    timer_payload,
    utcnow,
)
from temporality_agent_collab.rpc import QUEUE_GROUP
from temporality_agent_collab.signing import ReplyKey
from temporality_agent_collab.throttle import Throttle
from temporality_bus import (
    AlreadyExists,
    Bus,
    Delivery,
    Failure,
    NotFound,
    PermanentError,
    Request,
    Responder,
    Store,
    Timers,
)
from temporality_protocol import (
    AgentCard,
    AgentRefusal,
    AgentRegistration,
    AgentsQuery,
    AgentsReply,
    ConformanceAnswers,
    ConformanceReply,
    Deregistration,
    DeregistrationReply,
    Envelope,
    Heartbeat,
    HeartbeatAck,
    RegistrationReply,
    derive_id,
)
from temporality_protocol.catalog import (
    BUCKET_AGENTS,
    RPC_AGENTS_CONFORMANCE,
    RPC_AGENTS_DEREGISTER,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    TIMER_NS_AGENT_CONFORMANCE,
    TIMER_NS_AGENT_HEARTBEAT,
)
from temporality_protocol.events import AgentRefusalReason
from temporality_protocol.states import AgentLifecycleState

__all__ = ["ADDED_IN_1_0", "AgentRegistry"]

log = structlog.get_logger(__name__)

#: The reply properties added to protocol 1.0 after its first published schema (additive, AP-10), per operation:
#: left out of a reply when they have nothing to say (:func:`~temporality_agent_collab.gate.omit_null`), as the act
#: reply's ``child_run_id`` is, so an agent checking replies against the earlier 1.0 schema still reads them.
ADDED_IN_1_0: dict[str, frozenset[str]] = {
    "register": frozenset({"conformance"}),  # PRO-2: an open conformance round
    "heartbeat": frozenset({"conformance"}),
    "list": frozenset({"refusal"}),  # a signature refusal, typed (``error`` says it in words, as before)
}

#: Compare-and-set attempts on one agent's record: an agent heartbeating fast through several replicas races
#: itself, and a lost race only costs a re-read.
MODIFY_ATTEMPTS = 32


def _failure_refusal(failure: Failure) -> AgentRefusal:
    if failure.kind == "malformed":
        return AgentRefusal(reason="malformed_request", detail=f"malformed request: {failure.detail}"[:4096])
    return AgentRefusal(reason="internal_error", detail=f"internal error: {failure.detail}"[:4096])


class AgentRegistry:
    """The registry's responders and timer handler. Build with :meth:`open`; register :meth:`responders`
    and :meth:`handle_timer` with the runtime."""

    def __init__(
        self,
        bus: Bus,
        store: Store[AgentRecord],
        allow_list: AllowList,
        gate: MessageGate,
        *,
        grace_s: float,
        hosted: HostedAgents,
        conformance_timeout_s: float = DEFAULT_TIMEOUT_S,
        coalesce_s: float = 0.0,
    ) -> None:
        self._bus = bus
        self._store = store
        self.allow_list = allow_list
        self.gate = gate
        self.grace_s = grace_s
        self.hosted = hosted
        self.conformance_timeout_s = conformance_timeout_s
        #: The agent's own lifecycle moves and unchanged re-registrations are journaled at most once per this window.
        self.coalesce_s = coalesce_s
        self.timers = Timers(bus, TIMER_NS_AGENT_HEARTBEAT)
        self.conformance_timers = Timers(bus, TIMER_NS_AGENT_CONFORMANCE)

    @classmethod
    async def open(
        cls,
        bus: Bus,
        allow_list: AllowList,
        *,
        grace_s: float,
        signature_window_s: float = 120.0,
        conformance_timeout_s: float = DEFAULT_TIMEOUT_S,
        reply_key: ReplyKey | None = None,
        coalesce_s: float = 0.0,
        throttle: Throttle | None = None,
    ) -> AgentRegistry:
        gate = await MessageGate.open(
            bus, allow_list, window_s=signature_window_s, reply_key=reply_key, throttle=throttle
        )
        return cls(
            bus,
            await bus.store(BUCKET_AGENTS, AgentRecord),
            allow_list,
            gate,
            grace_s=grace_s,
            hosted=await HostedAgents.open(bus),
            conformance_timeout_s=conformance_timeout_s,
            coalesce_s=coalesce_s,
        )

    def responders(self, *, queue: str = QUEUE_GROUP, max_inflight: int = 8) -> list[Responder[Any, Any]]:
        """The five responders (not started): register, heartbeat, deregister, list, conformance. Every request passes
        the signature gate first (AP-11); a refused one gets its reply from ``refused``."""
        common: dict[str, Any] = {"gate": self.gate, "queue": queue, "max_inflight": max_inflight}
        return [
            SignedResponder(
                self._bus,
                RPC_AGENTS_REGISTER,
                request_model=AgentRegistration,
                handler=self._on_register,
                refused=lambda agent_id, refusal, _raw: RegistrationReply(
                    agent_id=agent_id, outcome="refused", refusal=refusal
                ),
                on_error=lambda f: RegistrationReply(
                    agent_id=claimed(f.raw, "agent_id"), outcome="refused", refusal=_failure_refusal(f)
                ),
                negotiate_versions=False,  # negotiated per agent against the allow-list, refusals journaled
                pass_unknown=True,  # an agent not listed: refused by register, which journals its declaration
                omit_when_null=ADDED_IN_1_0["register"],
                **common,
            ),
            SignedResponder(
                self._bus,
                RPC_AGENTS_HEARTBEAT,
                request_model=Heartbeat,
                handler=self._on_heartbeat,
                refused=lambda agent_id, refusal, _raw: HeartbeatAck(
                    agent_id=agent_id, accepted=False, refusal=refusal
                ),
                on_error=lambda f: HeartbeatAck(
                    agent_id=claimed(f.raw, "agent_id"), accepted=False, refusal=_failure_refusal(f)
                ),
                negotiate_versions=False,  # speaks the version its registration negotiated
                omit_when_null=ADDED_IN_1_0["heartbeat"],
                **common,
            ),
            SignedResponder(
                self._bus,
                RPC_AGENTS_DEREGISTER,
                request_model=Deregistration,
                handler=self._on_deregister,
                refused=lambda agent_id, refusal, _raw: DeregistrationReply(
                    agent_id=agent_id, outcome="refused", refusal=refusal
                ),
                on_error=lambda f: DeregistrationReply(
                    agent_id=claimed(f.raw, "agent_id"), outcome="refused", refusal=_failure_refusal(f)
                ),
                negotiate_versions=False,
                **common,
            ),
            SignedResponder(
                self._bus,
                RPC_AGENTS_LIST,
                request_model=AgentsQuery,
                handler=self._on_list,
                refused=lambda _agent_id, refusal, _raw: AgentsReply(error=refusal.detail, refusal=refusal),
                on_error=lambda f: AgentsReply(error=_failure_refusal(f).detail),
                omit_when_null=ADDED_IN_1_0["list"],
                **common,
            ),
            SignedResponder(
                self._bus,
                RPC_AGENTS_CONFORMANCE,
                request_model=ConformanceAnswers,
                handler=self._on_conformance,
                refused=lambda agent_id, refusal, _raw: ConformanceReply(
                    agent_id=agent_id, accepted=False, refusal=refusal
                ),
                on_error=lambda f: ConformanceReply(
                    agent_id=claimed(f.raw, "agent_id"), accepted=False, refusal=_failure_refusal(f)
                ),
                negotiate_versions=False,  # speaks the version its registration negotiated
                **common,
            ),
        ]

    # ------------------------------------------------------------------ effects of a stored record
    async def _journal(self, record: AgentRecord, *, registration: bool = False) -> None:
        """Publish what the stored record says happened, then (re-)arm its liveness timer."""
        events = lifecycle_events(record)
        if registration:
            events.insert(0, registered_event(record))
        for event in events:
            await self._bus.publish(event)
        if record.live:
            await self.timers.rearm(
                record.agent_id,
                record.deadline,
                timer_payload(record),
                msg_id=derive_id("tmr", record.agent_id, str(record.incarnation), str(record.beat)),
            )
        rnd = record.conformance
        if record.live and rnd is not None and rnd.open:  # the round's deadline (the same arm every time)
            await self.conformance_timers.arm(
                record.agent_id,
                rnd.deadline,
                conformance_timer_payload(record.agent_id, record.incarnation, rnd.round),
                msg_id=derive_id("tmr", "conformance", record.agent_id, str(record.incarnation), str(rnd.round)),
            )

    # ------------------------------------------------------------------ register (AP-3, PRO-3)
    async def _on_register(self, request: Request[AgentRegistration]) -> RegistrationReply:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id):
            return await self.register(body)

    async def register(self, body: AgentRegistration) -> RegistrationReply:
        """Register (AP-3); the reply carries the open conformance round's probes (PRO-2), if any."""
        allowed = self.allow_list.get(body.agent_id)
        try:
            if allowed is None:
                raise Refused("unknown_agent", f"agent {body.agent_id!r} is not allowed to register here")
            version = negotiated(body, allowed)
        except Refused as refused:
            supported = allowed.speakable_versions() if allowed is not None else []
            await self._journal_refusal(body, refused, supported)
            log.info("agent.registration_refused", reason=refused.reason, declared=body.declared_versions())
            return RegistrationReply(
                agent_id=body.agent_id, outcome="refused", supported_versions=supported, refusal=refused.refusal()
            )
        now = utcnow()
        key = agent_key(body.agent_id)
        params: dict[str, Any] = {
            "version": version,
            "grace_s": self.grace_s,
            "now": now,
            "conformance_timeout_s": self.conformance_timeout_s,
            "coalesce_s": self.coalesce_s,
        }
        try:
            if await self._store.get(key) is None:
                fresh = fresh_record(body, allowed, self.allow_list, **params)
                try:
                    await self._store.create(key, fresh)
                    record = fresh
                except AlreadyExists:  # another replica (or our own earlier attempt) got there first
                    record = await self._modify(
                        key, lambda cur: registered(cur, body, allowed, self.allow_list, **params)
                    )
            else:
                record = await self._modify(key, lambda cur: registered(cur, body, allowed, self.allow_list, **params))
        except Refused as refused:  # decommissioned by an operator and not readmitted
            await self._journal_refusal(body, refused, allowed.speakable_versions())
            log.info("agent.registration_refused", reason=refused.reason)
            return RegistrationReply(agent_id=body.agent_id, outcome="refused", refusal=refused.refusal())
        await self._journal(record, registration=record.registration_due)
        log.info("agent.registered", incarnation=record.incarnation, version=version, state=record.state.value)
        return RegistrationReply(
            agent_id=record.agent_id,
            outcome="registered",
            protocol_version=record.protocol_version,
            supported_versions=allowed.speakable_versions(),
            state=record.state,
            incarnation=record.incarnation,
            heartbeat_interval_s=record.heartbeat_interval_s,
            offline_after_s=record.offline_after_s,
            policy=record.policy,
            conformance=challenge(record.conformance, utcnow()),
        )

    async def _journal_refusal(self, body: AgentRegistration, refused: Refused, supported: list[str]) -> None:
        """``agent.registration_refused``, rate-limited per agent id and reason (:class:`Throttle`)."""
        event = refused_event(body, refused, supported)
        throttle = self.gate.throttle
        if throttle is None:
            await self._bus.publish(event)
            return

        def total(agent: str, count: int, window_s: int, event_id: str) -> Envelope:
            return refused_event(body, refused, supported, count=count, window_s=window_s, id=event_id, agent=agent)

        await throttle.journal("registration", body.agent_id, refused.reason, event, total)

    async def _modify(self, key: str, fn: Callable[[AgentRecord], AgentRecord | None]) -> AgentRecord:
        """One agent's record changed by ``fn``; an agent's requests race only each other (and its timer)."""
        return (await self._store.modify(key, fn, attempts=MODIFY_ATTEMPTS)).value

    # ------------------------------------------------------------------ heartbeat (AP-4)
    async def _on_heartbeat(self, request: Request[Heartbeat]) -> HeartbeatAck:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id):
            return await self.heartbeat(body)

    async def heartbeat(self, body: Heartbeat) -> HeartbeatAck:
        now = utcnow()
        try:
            record = await self._modify(
                agent_key(body.agent_id), lambda cur: heartbeat_seen(cur, body, now, coalesce_s=self.coalesce_s)
            )
        except NotFound:
            return self._ack_refused(body.agent_id, "not_registered", f"agent {body.agent_id!r} is not registered")
        except Refused as refused:
            return self._ack_refused(body.agent_id, refused.reason, refused.detail)
        await self._journal(record, registration=record.registration_due)
        if record.recent:
            log.info("agent.lifecycle_changed", moves=[t.to_state.value for t in record.recent])
        return HeartbeatAck(
            agent_id=record.agent_id,
            accepted=True,
            state=record.state,
            protocol_version=record.protocol_version,
            offline_at=record.deadline,
            conformance=challenge(record.conformance, now),  # until it is answered (a lost reply is no loss)
        )

    @staticmethod
    def _ack_refused(agent_id: str, reason: AgentRefusalReason, detail: str) -> HeartbeatAck:
        log.info("agent.heartbeat_refused", reason=reason)
        return HeartbeatAck(agent_id=agent_id, accepted=False, refusal=AgentRefusal(reason=reason, detail=detail))

    # ------------------------------------------------------------------ deregister (AP-2)
    async def _on_deregister(self, request: Request[Deregistration]) -> DeregistrationReply:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id):
            return await self.deregister(body)

    async def deregister(self, body: Deregistration) -> DeregistrationReply:
        now = utcnow()
        try:
            record = await self._modify(agent_key(body.agent_id), lambda cur: decommissioned(cur, body, now))
        except NotFound:
            refusal = AgentRefusal(reason="not_registered", detail=f"agent {body.agent_id!r} is not registered")
            return DeregistrationReply(agent_id=body.agent_id, outcome="refused", refusal=refusal)
        except Refused as refused:
            return DeregistrationReply(agent_id=body.agent_id, outcome="refused", refusal=refused.refusal())
        await self._journal(record)
        await self.timers.cancel(record.agent_id)  # a firing already on its way finds it decommissioned
        await self.conformance_timers.cancel(record.agent_id)
        log.info("agent.decommissioned", incarnation=record.incarnation)
        return DeregistrationReply(agent_id=record.agent_id, outcome="decommissioned", state=record.state)

    # ------------------------------------------------------------------ operators (the HTTP API)
    async def decommission(self, agent_id: str, *, by: str, reason: str) -> tuple[AgentRecord, bool]:
        """An operator takes the agent out of service (journaled with ``requested_by``); its later messages,
        a registration included, are refused until :meth:`readmit`. Returns the record and whether this call
        moved it (``False``: an operator already had). :class:`NotFound` for an agent never registered,
        :class:`AlreadyDecommissioned` for one that deregistered itself."""
        now = utcnow()
        result = await self._store.modify(
            agent_key(agent_id), lambda cur: operator_decommissioned(cur, by, reason, now), attempts=MODIFY_ATTEMPTS
        )
        record = result.value
        if result.changed:
            await self._journal(record)
            await self.timers.cancel(record.agent_id)
            await self.conformance_timers.cancel(record.agent_id)
            log.info("agent.decommissioned", agent_id=agent_id, by=by, incarnation=record.incarnation)
        return record, result.changed

    async def readmit(self, agent_id: str, *, by: str, reason: str) -> tuple[AgentRecord, bool]:
        """Lift an operator's hold: the agent may register again (journaled ``agent.readmitted``). Returns the
        record and whether there was a hold; :class:`NotFound` for an agent never registered."""
        key = agent_key(agent_id)
        before = await self._store.get(key)
        if before is None:
            raise NotFound(BUCKET_AGENTS.name, key)
        result = await self._store.modify(key, readmitted, attempts=MODIFY_ATTEMPTS)
        if result.changed:
            await self._bus.publish(readmitted_event(result.value, by, reason))
            log.info("agent.readmitted", agent_id=agent_id, by=by, incarnation=result.value.incarnation)
        return result.value, result.changed

    async def cards(
        self, *, include_decommissioned: bool, kind: Literal["all", "hosted", "external"] = "all"
    ) -> list[AgentCard]:
        """The hosted agents' cards (as their last ``run.started`` showed them), then the registered ones."""
        cards = await self.hosted.cards() if kind in ("all", "hosted") else []
        if kind == "hosted":
            return cards
        for key in sorted(await self._store.keys()):
            if not key.startswith("agent."):
                continue  # the bucket holds the hosted agents' cards too (hosted.<agent id>)
            found = await self._store.get(key)
            if found is None:
                continue
            if found.value.state is AgentLifecycleState.DECOMMISSIONED and not include_decommissioned:
                continue
            cards.append(card(found.value, self.allow_list))
        return cards

    # ------------------------------------------------------------------ discovery (PRO-2)
    async def _on_list(self, request: Request[AgentsQuery]) -> AgentsReply:
        query = request.body
        cards = await self.cards(include_decommissioned=query.include_decommissioned, kind=query.kind)
        return AgentsReply(protocol_version=request.version, agents=cards)

    # ------------------------------------------------------------------ conformance (PRO-2)
    async def _on_conformance(self, request: Request[ConformanceAnswers]) -> ConformanceReply:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id, round=body.round):
            return await self.conformance(body)

    async def conformance(self, body: ConformanceAnswers) -> ConformanceReply:
        """The agent's answers to its open round: the round ends with each capability's verdict, journaled
        (``agent.conformance_checked``) before the reply. A retry gets the same verdict (and republishes it)."""
        now = utcnow()
        try:
            record = await self._modify(agent_key(body.agent_id), lambda cur: conformance_answered(cur, body, now))
        except NotFound:
            refusal = AgentRefusal(reason="not_registered", detail=f"agent {body.agent_id!r} is not registered")
            return ConformanceReply(agent_id=body.agent_id, accepted=False, refusal=refusal)
        except Refused as refused:
            log.info("agent.conformance_refused", reason=refused.reason)
            return ConformanceReply(agent_id=body.agent_id, accepted=False, refusal=refused.refusal())
        rnd = record.conformance
        if rnd is None or rnd.results is None:  # pragma: no cover - conformance_answered ended this very round
            raise RuntimeError("the conformance round is not ended after its answers")
        await self._bus.publish(checked_event(record))
        await self.conformance_timers.cancel(record.agent_id)  # a firing already on its way finds it ended
        log.info("agent.conformance_checked", passed=rnd.passed, outcomes=[r.outcome for r in rnd.results])
        return ConformanceReply(
            agent_id=record.agent_id,
            accepted=True,
            round=rnd.round,
            results=rnd.results,
            capabilities=card(record, self.allow_list).capabilities,
        )

    async def handle_conformance_timer(self, data: bytes, delivery: Delivery | None = None) -> None:
        """An ``agent-conformance`` timer fired: the round ends ``timeout`` unless it was answered (or replaced)."""
        try:
            payload = ConformanceTimer.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable conformance timer payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(agent_id=payload.agent_id, round=payload.round):
            await self.conformance_deadline(payload, delivery)

    async def conformance_deadline(self, payload: ConformanceTimer, delivery: Delivery | None = None) -> None:
        key = agent_key(payload.agent_id)
        found = await self._store.get(key)
        if found is None:
            raise PermanentError(f"a conformance timer fired for {payload.agent_id!r}, which was never registered")
        now = utcnow()
        current = found.value
        rnd = current.conformance
        mine = current.incarnation == payload.incarnation and rnd is not None and rnd.round == payload.round
        if mine and rnd is not None and rnd.open and now < rnd.deadline:  # fired early: never fail a round early
            cause = f"seq:{delivery.stream_seq}" if delivery is not None else now.isoformat()
            await self.conformance_timers.rearm(
                current.agent_id,
                rnd.deadline,
                conformance_timer_payload(current.agent_id, current.incarnation, rnd.round),
                msg_id=derive_id(
                    "tmr", "conformance", current.agent_id, str(current.incarnation), str(rnd.round), cause
                ),
            )
            log.warning("conformance_timer.fired_early", deadline=rnd.deadline.isoformat())
            return
        result = await self._store.modify(
            key,
            lambda cur: conformance_timed_out(cur, payload.incarnation, payload.round, now),
            attempts=MODIFY_ATTEMPTS,
        )
        record = result.value
        ended = record.conformance
        if (
            record.incarnation == payload.incarnation
            and ended is not None
            and ended.round == payload.round
            and not ended.open
            and ended.answered_at is None
        ):
            await self._bus.publish(checked_event(record))  # republished on a redelivery: the same id
            if result.changed:
                log.info("agent.conformance_timed_out", incarnation=record.incarnation)
            return
        log.info("conformance_timer.ignored", round=payload.round)

    # ------------------------------------------------------------------ liveness timers
    async def handle_timer(self, data: bytes, delivery: Delivery | None = None) -> None:
        """An ``agent-heartbeat`` timer fired: ``offline`` unless a newer heartbeat came (its marker moved)."""
        try:
            payload = TimerPayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable heartbeat timer payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(agent_id=payload.agent_id):
            await self.missed(payload, delivery)

    async def missed(self, payload: TimerPayload, delivery: Delivery | None = None) -> None:
        key = agent_key(payload.agent_id)
        found = await self._store.get(key)
        if found is None:
            raise PermanentError(f"a heartbeat timer fired for {payload.agent_id!r}, which was never registered")
        current = found.value
        now = utcnow()
        marked = current.incarnation == payload.incarnation and current.beat == payload.beat
        if marked and current.live and now < current.deadline:  # fired early: never go offline early
            cause = f"seq:{delivery.stream_seq}" if delivery is not None else now.isoformat()
            await self.timers.rearm(
                current.agent_id,
                current.deadline,
                timer_payload(current),
                msg_id=derive_id("tmr", current.agent_id, str(current.incarnation), str(current.beat), cause),
            )
            log.warning("agent_timer.fired_early", deadline=current.deadline.isoformat())
            return
        result = await self._store.modify(
            key, lambda cur: heartbeat_missed(cur, payload.incarnation, payload.beat, now), attempts=MODIFY_ATTEMPTS
        )
        record = result.value
        if record.state is AgentLifecycleState.OFFLINE and record.incarnation == payload.incarnation:
            if record.recent and record.recent[-1].reason == "heartbeat_missed" and record.beat == payload.beat:
                await self._journal(record)  # republished on a redelivery: the same ids
                if result.changed:
                    log.info("agent.offline", incarnation=record.incarnation, beat=record.beat)
                return
        log.info("agent_timer.ignored", state=record.state.value, beat=payload.beat, current_beat=record.beat)
