"""Ask routing between agents (COL-2..COL-9, PRO-1), pure: the routing record, addressing, the events.

No I/O here. :func:`resolve` turns what the model wrote (``to``) into a decision against the asker's
saga projection -- never outside it (COL-7); :func:`relay_run_id` names relay runs; the ``*_event``
functions build the events agent-collab publishes, each with a deterministic id so a redelivered
input republishes the very same facts (JetStream and the journal deduplicate them by id).

The record (KV ``collab-sagas`` / ``ask.<request_id>``) is the routing projection only: who asked,
whom it reached, where it stands in :data:`temporality_protocol.states.AGENT_ASK` and which reply
settled it. The request's history itself is the journal (``agent.*`` events) and the runs' own
histories (COL-5).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_agent_collab.participants import InvalidKey, RunEntry, SagaParticipants
from temporality_protocol import (
    RUN,
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
    Envelope,
    EventData,
    HumanPolicy,
    LaunchSource,
    RelayRequest,
    RunRequested,
    derive_id,
    make_event,
)
from temporality_protocol.states import AGENT_ASK, AgentAskState

__all__ = [
    "RELAY_MAX_TURNS",
    "SOURCE",
    "AskRecord",
    "Live",
    "Relay",
    "RelayIndex",
    "ReplyRefusal",
    "Resolution",
    "Undeliverable",
    "answer_received_event",
    "ask_key",
    "expired_event",
    "message_received_event",
    "new_record",
    "parse_relay_run",
    "relay_index_key",
    "relay_input",
    "relay_requested_event",
    "relay_run_id",
    "reply_undeliverable_event",
    "resolve",
    "undeliverable_event",
]

#: ``source`` of every event agent-collab publishes.
SOURCE = "/temporality/agent-collab"
#: A relay run's turn budget (COL-6): enough to read the question, answer and finish.
RELAY_MAX_TURNS = 6
#: Relay runs are ``<target>/ask/NN``: never an ``agent:<id>`` resolution target themselves.
_RELAY_RUN = re.compile(r"^(?P<target>.+)/ask/(?P<number>\d+)$")
_KEY_TOKEN = re.compile(r"^[A-Za-z0-9_=-]+$")
_NEVER = datetime.min.replace(tzinfo=UTC)

UndeliverableReason = Literal[
    "invalid_address", "unknown_addressee", "self_addressed", "asker_unknown", "relay_failed", "routing_failed"
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class AskRecord(_Model):
    """KV ``collab-sagas`` / ``ask.<request_id>``: one ask as agent-collab routed it."""

    request_id: str
    saga_id: str
    asker_run_id: str
    asker_agent: str
    to: str
    mode: Literal["async", "wait"]
    timeout_s: int
    message: str
    truncated: bool = False
    #: The ``agent.asked`` event that opened it (the causation of what agent-collab publishes).
    asked_event_id: str
    asked_at: datetime
    state: AgentAskState = AgentAskState.ASKED
    # where it went (``delivered``)
    resolved_run_id: str | None = None
    resolved_agent: str | None = None
    recipient_run_id: str | None = None
    relay: bool = False
    relay_run: str | None = None
    expires_at: datetime | None = None
    # why it went nowhere (``undeliverable``)
    reason: UndeliverableReason | None = None
    detail: str | None = None
    #: Set when a wait expired: a reply after it is ``late`` (COL-2).
    expired_at: datetime | None = None
    # the reply that settled it (``answered`` / ``refused`` / ``reply_undeliverable``)
    reply_event_id: str | None = None
    replier_run_id: str | None = None
    replier_agent: str | None = None
    outcome: Literal["answer", "refusal"] | None = None
    answer: str | None = None
    answer_truncated: bool = False
    replied_at: datetime | None = None

    def moved_to(self, state: AgentAskState, **changes: Any) -> AskRecord:
        """The record in ``state`` (checked against :data:`AGENT_ASK`), validated with ``changes``."""
        AGENT_ASK.transition(self.state, state)
        return AskRecord.model_validate({**self.model_dump(), **changes, "state": state})


class RelayIndex(_Model):
    """KV ``collab-sagas`` / ``relays.<target_run_id>``: the requests relayed for a finished run, in order.

    A request's relay number is its position here plus one (``/ask/01`` first): appended once, so a
    redelivered ask gets the number it got the first time."""

    request_ids: list[str] = Field(default_factory=list)


def ask_key(request_id: str) -> str:
    if not _KEY_TOKEN.fullmatch(request_id):
        raise InvalidKey(f"request id {request_id!r} cannot be a KV key token ([A-Za-z0-9_=-]+)")
    return f"ask.{request_id}"


def relay_index_key(target_run_id: str) -> str:
    if (
        not re.fullmatch(r"^[-/_=.a-zA-Z0-9]+$", target_run_id)
        or target_run_id.startswith(".")
        or (target_run_id.endswith("."))
    ):
        raise InvalidKey(f"run id {target_run_id!r} cannot be a KV key token")
    return f"relays.{target_run_id}"


def relay_run_id(target_run_id: str, number: int) -> str:
    """COL-6: ``<target>/ask/NN`` (``01``, ``02``, ... ``100`` past 99)."""
    return f"{target_run_id}/ask/{number:02d}"


def parse_relay_run(run_id: str) -> tuple[str, int] | None:
    """``<target>/ask/NN`` -> ``(target, NN)``; ``None`` for a run that is not named as a relay run."""
    match = _RELAY_RUN.fullmatch(run_id)
    if match is None or int(match["number"]) < 1:
        return None
    return match["target"], int(match["number"])


# --------------------------------------------------------------------------- resolution
@dataclass(frozen=True)
class Undeliverable:
    reason: UndeliverableReason
    detail: str


@dataclass(frozen=True)
class Live:
    """The addressee is running (or waiting): it gets the message at its next turn boundary."""

    run_id: str
    agent: str | None


@dataclass(frozen=True)
class Relay:
    """The addressee has finished: a relay run of the same agent answers for it."""

    run_id: str
    agent: str


Resolution = Undeliverable | Live | Relay


def _latest_of_agent(saga: SagaParticipants, agent: str) -> tuple[str, RunEntry] | None:
    candidates = [
        (run_id, run) for run_id, run in saga.runs.items() if run.agent == agent and parse_relay_run(run_id) is None
    ]
    if not candidates:
        return None
    # latest-started first; a run whose start was not seen yet counts as oldest; the run id breaks ties
    return max(candidates, key=lambda c: (c[1].started_at is not None, c[1].started_at or _NEVER, c[0]))


def resolve(asked: AgentAsked, saga: SagaParticipants | None) -> Resolution:
    """Where ``asked.to`` leads inside the asker's saga (``None``: the asker's saga is not known).

    ``agent:<id>`` is that agent's latest-started run in the saga (relay runs excluded), ``run:<id>``
    and a bare id a run of the saga. Anything outside the saga is ``unknown_addressee``, whether it
    exists elsewhere or not (COL-7: a foreign agent never resolves, and is not told apart).
    """
    if saga is None or asked.asker_run_id not in saga.runs:
        return Undeliverable("asker_unknown", f"run {asked.asker_run_id} is not known to agent-collab")
    to = asked.to.strip()
    scheme, sep, rest = to.partition(":")
    if sep and scheme == "agent":
        if not rest:
            return Undeliverable("invalid_address", "agent: needs an agent id (agent:<id>)")
        found = _latest_of_agent(saga, rest)
        if found is None:
            return Undeliverable("unknown_addressee", f"no agent {rest!r} in this saga (see get_collaborators)")
        run_id, run = found
    elif (sep and scheme == "run") or not sep:
        run_id = rest if sep else to
        if not run_id:
            return Undeliverable("invalid_address", "run: needs a run id (run:<id>)")
        if run_id not in saga.runs:
            hint = "" if sep else f"; for an agent write agent:{run_id}"
            return Undeliverable("unknown_addressee", f"no run {run_id!r} in this saga (see get_collaborators){hint}")
        run = saga.runs[run_id]
    else:
        return Undeliverable(
            "invalid_address",
            f"{to!r} is not an agent address: write agent:<id>, run:<id> or a run id (a person: ask_human)",
        )
    if run_id == asked.asker_run_id:
        return Undeliverable("self_addressed", f"{to!r} is the asking run itself")
    if run.status not in RUN.terminal:
        return Live(run_id, run.agent)
    if not run.agent:
        return Undeliverable("relay_failed", f"run {run_id} has finished and its agent is not known: no relay run")
    return Relay(run_id, run.agent)


def new_record(
    asked: AgentAsked, event: Envelope, saga_id: str, resolution: Resolution, relay_number: int
) -> AskRecord:
    """The record of a first-seen ask, already moved to ``delivered`` or ``undeliverable``."""
    record = AskRecord(
        request_id=asked.request_id,
        saga_id=saga_id,
        asker_run_id=asked.asker_run_id,
        asker_agent=asked.asker_agent,
        to=asked.to,
        mode=asked.mode,
        timeout_s=asked.timeout_s,
        message=asked.message,
        truncated=asked.truncated,
        asked_event_id=event.id,
        asked_at=event.time,
    )
    if isinstance(resolution, Undeliverable):
        return record.moved_to(AgentAskState.UNDELIVERABLE, reason=resolution.reason, detail=resolution.detail)
    expires_at = event.time + timedelta(seconds=asked.timeout_s) if asked.mode == "wait" else None
    if isinstance(resolution, Live):
        return record.moved_to(
            AgentAskState.DELIVERED,
            resolved_run_id=resolution.run_id,
            resolved_agent=resolution.agent,
            recipient_run_id=resolution.run_id,
            expires_at=expires_at,
        )
    relay = relay_run_id(resolution.run_id, relay_number)
    return record.moved_to(
        AgentAskState.DELIVERED,
        resolved_run_id=resolution.run_id,
        resolved_agent=resolution.agent,
        recipient_run_id=relay,
        relay=True,
        relay_run=relay,
        expires_at=expires_at,
    )


# --------------------------------------------------------------------------- events
def _event(data: EventData, record: AskRecord, *, run_id: str, id: str, causation: str | None = None) -> Envelope:
    return make_event(
        data,
        source=SOURCE,
        id=id,
        run_id=run_id,
        correlation_id=record.saga_id,
        causation_id=causation or record.asked_event_id,
        actor="service:agent-collab",
    )


def undeliverable_event(record: AskRecord) -> Envelope:
    """``agent.ask_undeliverable`` to the asker (terminal)."""
    assert record.reason is not None
    data = AgentAskUndeliverable(
        request_id=record.request_id,
        asker_run_id=record.asker_run_id,
        to=record.to,
        reason=record.reason,
        detail=record.detail or record.reason,
    )
    return _event(data, record, run_id=record.asker_run_id, id=derive_id("evt", data.EVENT_TYPE, record.request_id))


def routing_failed_event(asked: Envelope, request_id: str, asker_run_id: str, to: str, detail: str) -> Envelope:
    """``agent.ask_undeliverable`` (``routing_failed``) for an ask agent-collab gave up on without a record (its
    data unreadable): built from the ``agent.asked`` envelope; the same id as any other terminal of the request."""
    data = AgentAskUndeliverable(
        request_id=request_id, asker_run_id=asker_run_id, to=to, reason="routing_failed", detail=detail
    )
    return make_event(
        data,
        source=SOURCE,
        id=derive_id("evt", data.EVENT_TYPE, request_id),
        run_id=asker_run_id,
        correlation_id=asked.correlationid or asker_run_id,
        causation_id=asked.id,
        actor="service:agent-collab",
    )


def message_received_event(record: AskRecord) -> Envelope:
    """``agent.message.received`` for the recipient (its ``runid``), once per request."""
    assert record.resolved_run_id is not None
    assert record.recipient_run_id is not None
    data = AgentMessageReceived(
        request_id=record.request_id,
        asker_run_id=record.asker_run_id,
        asker_agent=record.asker_agent,
        to=record.to,
        resolved_run_id=record.resolved_run_id,
        resolved_agent=record.resolved_agent,
        recipient_run_id=record.recipient_run_id,
        mode=record.mode,
        timeout_s=record.timeout_s,
        expires_at=record.expires_at,
        message=record.message,
        truncated=record.truncated,
        relay=record.relay,
        relay_run=record.relay_run,
    )
    return _event(data, record, run_id=record.recipient_run_id, id=derive_id("evt", data.EVENT_TYPE, record.request_id))


def relay_input(record: AskRecord) -> dict[str, Any]:
    """A relay run's self-contained input (COL-6): who asks, the request, what to do; the ask itself in
    ``incoming_asks`` so its request id is valid from the first turn."""
    asker = f"agent:{record.asker_agent}"
    instructions = (
        f"You are a short follow-up of your earlier run {record.resolved_run_id}, started only to answer one "
        f"question from {asker} (run {record.asker_run_id}). Request {record.request_id}: read the question in "
        f"incoming_asks, then call answer_agent(request_id={record.request_id!r}, answer=...) -- or refuse with "
        f"the reason if you cannot or should not answer -- and finish. You cannot delegate, and you have at most "
        f"{RELAY_MAX_TURNS} turns."
    )
    return {
        "instructions": instructions,
        "relay": {
            "request_id": record.request_id,
            "asker_run_id": record.asker_run_id,
            "asker_agent": record.asker_agent,
            "target_run_id": record.resolved_run_id,
        },
        "incoming_asks": [
            {
                "request_id": record.request_id,
                "type": "ask",
                "from": asker,
                "from_run_id": record.asker_run_id,
                "mode": record.mode,
                "message": record.message,
                "truncated": record.truncated,
                # a wait's deadline, so the relay run is told "(until …)" as a delivered ask is
                **({"expires_at": record.expires_at.isoformat()} if record.expires_at is not None else {}),
            }
        ],
    }


def relay_requested_event(record: AskRecord) -> Envelope:
    """``run.requested`` for the relay run: same agent, parent = the finished run, 6 turns, no delegation,
    nobody to ask (an empty recipient list is no wider than any initiator's policy)."""
    assert record.relay_run is not None
    assert record.resolved_run_id is not None
    assert record.resolved_agent
    data = RunRequested(
        run_id=record.relay_run,
        agent=record.resolved_agent,
        title=f"Answer {record.asker_agent}'s question {record.request_id}"[:200],
        launch=LaunchSource(kind="event"),
        input=relay_input(record),
        human=HumanPolicy(allowed_recipients=[]),
        parent_run_id=record.resolved_run_id,
        relay=RelayRequest(
            request_id=record.request_id,
            asker_run_id=record.asker_run_id,
            asker_agent=record.asker_agent,
            target_run_id=record.resolved_run_id,
            max_turns=RELAY_MAX_TURNS,
        ),
    )
    return _event(data, record, run_id=record.relay_run, id=derive_id("evt", "relay", record.request_id))


def expired_event(record: AskRecord) -> Envelope:
    """``agent.ask_expired`` to the asker: it stops waiting; the request stays open (COL-2)."""
    assert record.recipient_run_id is not None
    data = AgentAskExpired(
        request_id=record.request_id,
        asker_run_id=record.asker_run_id,
        recipient_run_id=record.recipient_run_id,
        timeout_s=record.timeout_s,
        waited_s=float(record.timeout_s),
    )
    return _event(data, record, run_id=record.asker_run_id, id=derive_id("evt", data.EVENT_TYPE, record.request_id))


def answer_received_event(record: AskRecord) -> Envelope:
    """``agent.answer.received`` to the asker, from the reply stored on the record (answer or refusal)."""
    assert record.replier_run_id is not None
    assert record.replier_agent is not None
    assert record.outcome is not None
    assert record.answer is not None
    assert record.replied_at is not None
    data = AgentAnswerReceived(
        request_id=record.request_id,
        asker_run_id=record.asker_run_id,
        replier_run_id=record.replier_run_id,
        replier_agent=record.replier_agent,
        outcome=record.outcome,
        answer=record.answer,
        truncated=record.answer_truncated,
        mode=record.mode,
        late=record.expired_at is not None,
        relay=record.relay,
        relay_run=record.relay_run,
        waited_s=max(0.0, (record.replied_at - record.asked_at).total_seconds()),
    )
    return _event(
        data,
        record,
        run_id=record.asker_run_id,
        id=derive_id("evt", data.EVENT_TYPE, record.request_id),
        causation=record.reply_event_id,
    )


ReplyRefusal = Literal["unknown_request", "not_received", "already_answered", "asker_finished", "request_closed"]


def reply_undeliverable_event(
    replied: AgentReplied,
    event: Envelope,
    reason: ReplyRefusal,
    detail: str,
    record: AskRecord | None,
) -> Envelope:
    """``agent.reply_undeliverable`` for the replier (its ``runid``), once per ``agent.replied`` event."""
    data = AgentReplyUndeliverable(
        request_id=replied.request_id,
        replier_run_id=replied.replier_run_id,
        asker_run_id=record.asker_run_id if record is not None else None,
        reason=reason,
        detail=detail,
    )
    return make_event(
        data,
        source=SOURCE,
        id=derive_id("evt", data.EVENT_TYPE, event.id),
        run_id=replied.replier_run_id,
        correlation_id=record.saga_id if record is not None else event.correlationid,
        causation_id=event.id,
        actor="service:agent-collab",
    )
