"""How the ``agent.*`` events move one ask row (COL-9: who asked whom, and why a message went nowhere). Pure.

The key is ``data.request_id``. The state follows :data:`temporality_protocol.states.AGENT_ASK`:

=============================  ======================================================================
event                          effect on the ask
=============================  ======================================================================
agent.asked                    ``asked``; asker run and agent, ``to`` as written, mode, timeout,
                               message, saga (``correlationid``), ``asked_at``
agent.message.received         ``delivered``; the resolved run and agent, the recipient, relay run,
                               ``expires_at`` (wait mode), ``delivered_at``
agent.ask_expired              ``expired`` (not terminal: a late answer still comes, COL-2)
agent.replied                  the reply (replier, outcome, answer, ``replied_at``) -- only from the
                               run that received the ask, and only when none is known yet; no move
agent.answer.received          ``answered`` or ``refused`` (PRO-1); the reply as routed back, ``late``,
                               ``waited_s``
agent.ask_undeliverable        ``undeliverable``, ``reason`` and ``detail``
agent.reply_undeliverable      with ``asker_finished``: ``reply_undeliverable``, ``reason``, ``detail``;
                               other reasons (an unknown request, a second answer, a reply from the
                               wrong run, a closed request) leave the ask as it is: the refusal stays
                               in the replier's trajectory
=============================  ======================================================================

Out-of-order and repeated delivery: the state only moves forward (``asked`` < ``delivered`` <
``expired`` < a terminal state, which every transition of ``AGENT_ASK`` respects) and never leaves a
terminal state; descriptive fields are only filled while blank (the routed answer of
``agent.answer.received`` wins over an ``agent.replied`` seen before it); projecting the same event
twice gives the same row; ``asked_at`` is the earliest time of the ask's events. Any event but ``agent.replied`` and the non-terminal refusals creates the
row when it is missing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporality_journal.models import AskSnapshot, as_utc, updated
from temporality_protocol import Envelope, EventData
from temporality_protocol.events import (
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
)
from temporality_protocol.states import AGENT_ASK, AgentAskState

__all__ = ["ASK_TYPES", "ask_rank", "project_ask", "request_id_of"]

#: The event types that move asks.
ASK_TYPES: frozenset[str] = frozenset(
    m.EVENT_TYPE
    for m in (
        AgentAsked,
        AgentMessageReceived,
        AgentReplied,
        AgentAnswerReceived,
        AgentAskExpired,
        AgentAskUndeliverable,
        AgentReplyUndeliverable,
    )
)

_RANK: dict[AgentAskState, int] = {
    AgentAskState.ASKED: 0,
    AgentAskState.DELIVERED: 1,
    AgentAskState.EXPIRED: 2,
}


def ask_rank(state: AgentAskState) -> int:
    """How far along ``state`` is: the projection only moves an ask to a higher rank."""
    return 3 if state in AGENT_ASK.terminal else _RANK[state]


def request_id_of(event: Envelope) -> str | None:
    """The ask an ``agent.*`` event belongs to (``data.request_id``); ``None`` for any other event."""
    if event.type not in ASK_TYPES:
        return None
    value = event.data.get("request_id")
    return value if isinstance(value, str) and value else None


def project_ask(current: AskSnapshot | None, event: Envelope, stream_seq: int) -> AskSnapshot | None:
    """The ask after ``event``; ``None`` when the event changes nothing (or is no ask event).

    Raises :class:`temporality_protocol.InvalidEnvelope` when the ``data`` is invalid for its type.
    """
    request_id = request_id_of(event)
    if request_id is None:
        return None
    if current is not None and current.request_id != request_id:
        raise ValueError(f"event {event.id} belongs to ask {request_id}, not {current.request_id}")
    data = event.payload()
    time = as_utc(event.time)
    if current is None:
        if isinstance(data, AgentReplied) or (
            isinstance(data, AgentReplyUndeliverable) and data.reason != "asker_finished"
        ):
            return None
        base = AskSnapshot(request_id=request_id, state=AGENT_ASK.initial, asked_at=time, updated_at=time)
    else:
        base = current
    after = _apply(base, data, time)
    if after is None:
        return None
    after = _fill(after, correlation_id=event.correlationid)
    if time < after.asked_at:  # until agent.asked is seen, the earliest event of the ask stands in for it
        after = _set(after, asked_at=time)
    if after == base and current is not None:
        return None
    last = stream_seq if after.last_event_seq is None else max(after.last_event_seq, stream_seq)
    after = _set(after, updated_at=max(after.updated_at, time), last_event_seq=last)
    return None if after == current else after


def _apply(ask: AskSnapshot, data: EventData, time: datetime) -> AskSnapshot | None:
    match data:
        case AgentAsked():
            ask = _fill(
                ask,
                asker_run_id=data.asker_run_id,
                asker_agent=data.asker_agent,
                to_address=data.to,
                mode=data.mode,
                timeout_s=data.timeout_s,
                message=data.message,
                truncated=data.truncated,
            )
            return _move(ask, AgentAskState.ASKED, time)
        case AgentMessageReceived():
            ask = _fill(
                ask,
                asker_run_id=data.asker_run_id,
                asker_agent=data.asker_agent,
                to_address=data.to,
                mode=data.mode,
                timeout_s=data.timeout_s,
                message=data.message,
                truncated=data.truncated,
                resolved_run_id=data.resolved_run_id,
                resolved_agent=data.resolved_agent,
                recipient_run_id=data.recipient_run_id,
                relay=data.relay,
                relay_run=data.relay_run,
                expires_at=None if data.expires_at is None else as_utc(data.expires_at),
                delivered_at=time,
            )
            return _move(ask, AgentAskState.DELIVERED, time)
        case AgentAskExpired():
            ask = _fill(ask, asker_run_id=data.asker_run_id, recipient_run_id=data.recipient_run_id, expired_at=time)
            return _move(ask, AgentAskState.EXPIRED, time)
        case AgentReplied():
            if ask.recipient_run_id is not None and ask.recipient_run_id != data.replier_run_id:
                return None  # not the run that got the ask: agent-collab refuses it (not_received)
            if ask.replier_run_id is not None:
                return None  # a reply is known already; a second one is refused (already_answered)
            return _fill(
                ask,
                replier_run_id=data.replier_run_id,
                replier_agent=data.replier_agent,
                outcome=data.outcome,
                answer=data.answer,
                replied_at=time,
            )
        case AgentAnswerReceived():
            if ask.state in AGENT_ASK.terminal:
                return _fill(ask, asker_run_id=data.asker_run_id)
            ask = _set(
                _fill(ask, asker_run_id=data.asker_run_id, mode=data.mode, relay=data.relay, relay_run=data.relay_run),
                replier_run_id=data.replier_run_id,
                replier_agent=data.replier_agent,
                outcome=data.outcome,
                answer=data.answer,
                late=data.late,
                waited_s=data.waited_s,
            )
            ask = _fill(ask, replied_at=time)
            target = AgentAskState.ANSWERED if data.outcome == "answer" else AgentAskState.REFUSED
            return _move(ask, target, time)
        case AgentAskUndeliverable():
            ask = _fill(ask, asker_run_id=data.asker_run_id, to_address=data.to)
            if ask.state not in AGENT_ASK.terminal:
                ask = _set(ask, reason=data.reason, detail=data.detail)
            return _move(ask, AgentAskState.UNDELIVERABLE, time)
        case AgentReplyUndeliverable():
            if data.reason != "asker_finished":
                return None
            ask = _fill(ask, asker_run_id=data.asker_run_id, replier_run_id=data.replier_run_id)
            if ask.state not in AGENT_ASK.terminal:
                ask = _set(ask, reason=data.reason, detail=data.detail)
            return _move(ask, AgentAskState.REPLY_UNDELIVERABLE, time)
        case _:  # pragma: no cover - ASK_TYPES lists exactly the cases above
            return None


def _fill(ask: AskSnapshot, **values: Any) -> AskSnapshot:
    """Set the fields that are still blank."""
    blank = {k: v for k, v in values.items() if v is not None and getattr(ask, k) is None}
    return _set(ask, **blank) if blank else ask


def _set(ask: AskSnapshot, **values: Any) -> AskSnapshot:
    """``ask`` with ``values`` (from validated event data: not validated again)."""
    return updated(ask, values)


def _move(ask: AskSnapshot, target: AgentAskState, time: datetime) -> AskSnapshot:
    """``target`` when it is further along than the ask's state (never out of a terminal state)."""
    if ask_rank(target) <= ask_rank(ask.state):
        return ask
    finished = {"finished_at": time} if target in AGENT_ASK.terminal else {}
    return _set(ask, state=target, **finished)
