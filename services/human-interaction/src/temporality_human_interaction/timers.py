"""The timers this service arms: JetStream message schedules, never ``asyncio.sleep``.

Every timer carries the payload ``{"request_id": ...}`` and fires onto a subject under
``temporality.timers.fired.human.>``, which the deadlines consumer hands to
:class:`temporality_human_interaction.deadlines.DeadlineHandler`. The handler decides from the
record, not from the subject, so any timer firing at any time is safe:

=========  ==============================================  =============================================
timer      schedule subject -> fired subject               armed
=========  ==============================================  =============================================
deadline   ``…schedule.human.<id>`` -> ``…fired.human.     when the request is stored, before delivery
           <id>``, at ``expires_at`` (rounded up)          (HUM-8: a request nobody could reach expires);
                                                           a web inbox question's in one pipelined round
                                                           with its ``human.notified``, each stored or not
                                                           on its own (a failure fails the intake: its
                                                           redelivery arms it)
repair     ``…schedule.human.<id>.repair`` ->              when an answer is bound, in one pipelined round
           ``…fired.human.<id>.repair``, a little later    with its ``human.answered`` (the timer's write
                                                           first; each stored or not on its own):
                                                           announces it if the publish was lost
rearm      ``…schedule.human.<id>.rearm`` ->               when a timer fired on a request still pending
           ``…fired.human.<id>``, at ``expires_at``        before its ``expires_at``
chain      ``…schedule.human.<id>.chain`` ->               the timeout policy's next step (HUM-8: a
           ``…fired.human.<id>.chain``, payload also       reminder, the escalation), armed once the
           ``"step": <index>``                             question (or the previous step) is committed
=========  ==============================================  =============================================

One ``chain`` key per request: arming the next step replaces the schedule of the one that fired.
"""

from __future__ import annotations

import json
from datetime import datetime

from temporality_bus import Bus, PublishResult, Timers
from temporality_bus.pipeline import Write
from temporality_protocol import derive_id
from temporality_protocol.catalog import TIMER_NS_HUMAN

__all__ = [
    "answer_repair_write",
    "arm_chain_step",
    "arm_deadline",
    "chain_key",
    "chain_step_write",
    "deadline_write",
    "human_timers",
    "rearm_deadline",
    "rearm_key",
    "repair_key",
    "timer_payload",
]


def timer_payload(request_id: str, step: int | None = None) -> bytes:
    body: dict[str, object] = {"request_id": request_id}
    if step is not None:
        body["step"] = step
    return json.dumps(body).encode()


def human_timers(bus: Bus) -> Timers:
    """This service's timer namespace (``human``): keys are request ids, plus the suffixes below. The timers
    carry no trace context: the handlers continue the request's stored one (``trace="none"``)."""
    return Timers(bus, TIMER_NS_HUMAN, trace="none")


def repair_key(request_id: str) -> str:
    return f"{request_id}.repair"


def rearm_key(request_id: str) -> str:
    return f"{request_id}.rearm"


def chain_key(request_id: str) -> str:
    return f"{request_id}.chain"


async def arm_chain_step(
    bus: Bus, request_id: str, step: int, at: datetime, *, cause: str | None = None
) -> PublishResult:
    """The timer of the chain's step ``step`` (an index into :func:`.chain.plan`), at ``at``.

    The msg id is the step's (a repeat, by a redelivery or another replica, is deduplicated); ``cause``
    (an early firing) keys a re-arm of the same step."""
    return await bus.publish_write(chain_step_write(bus, request_id, step, at, cause=cause))


def chain_step_write(bus: Bus, request_id: str, step: int, at: datetime, *, cause: str | None = None) -> Write:
    """The write :func:`arm_chain_step` publishes, for a batch with others (``bus.pipeline.send``)."""
    msg_id = derive_id("tmr", request_id, "chain", str(step), *((cause,) if cause else ()))
    return human_timers(bus).arm_write(chain_key(request_id), at, timer_payload(request_id, step), msg_id=msg_id)


async def arm_deadline(bus: Bus, request_id: str, expires_at: datetime) -> PublishResult:
    """The request's deadline; a repeat (redelivered ``human.requested``) is deduplicated by its msg id."""
    return await bus.publish_write(deadline_write(bus, request_id, expires_at))


def deadline_write(bus: Bus, request_id: str, expires_at: datetime) -> Write:
    """The write :func:`arm_deadline` publishes, for a batch with others (``bus.pipeline.send``)."""
    return human_timers(bus).arm_write(
        request_id, expires_at, timer_payload(request_id), msg_id=derive_id("tmr", request_id)
    )


def answer_repair_write(bus: Bus, request_id: str, at: datetime) -> Write:
    """A timer that announces the bound answer if its ``human.answered`` was lost (one per request): the write, sent
    in the round that publishes the event (``bus.pipeline.send``, :mod:`.answers`)."""
    return human_timers(bus).arm_write(
        repair_key(request_id), at, timer_payload(request_id), msg_id=derive_id("tmr", request_id, "repair")
    )


async def rearm_deadline(bus: Bus, request_id: str, at: datetime, *, cause: str) -> PublishResult:
    """The deadline again, for a timer that fired early; ``cause`` (the early firing) keys the msg id.

    Armed under its own key (``<id>.rearm``) but firing as the deadline (``…fired.human.<id>``).
    """
    return await human_timers(bus).rearm(
        rearm_key(request_id),
        at,
        timer_payload(request_id),
        msg_id=derive_id("tmr", request_id, "rearm", cause),
        target_key=request_id,
    )
