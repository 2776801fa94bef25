"""The timers this service arms: JetStream message schedules, never ``asyncio.sleep``.

Every timer carries the payload ``{"request_id": ...}`` and fires onto a subject under
``temporality.timers.fired.human.>``, which the deadlines consumer hands to
:class:`temporality_human_interaction.deadlines.DeadlineHandler`. The handler decides from the
record, not from the subject, so any timer firing at any time is safe:

=========  ==============================================  =============================================
timer      schedule subject -> fired subject               armed
=========  ==============================================  =============================================
deadline   ``…schedule.human.<id>`` -> ``…fired.human.     when the request is stored, before delivery
           <id>``, at ``expires_at`` (rounded up)          (HUM-8: a request nobody could reach expires)
repair     ``…schedule.human.<id>.repair`` ->              when an answer is bound, before it is
           ``…fired.human.<id>.repair``, a little later    published: announces it if the publish was lost
rearm      ``…schedule.human.<id>.rearm`` ->               when a timer fired on a request still pending
           ``…fired.human.<id>``, at ``expires_at``        before its ``expires_at``
=========  ==============================================  =============================================
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from temporality_bus import Bus, PublishResult, schedule_at
from temporality_protocol import derive_id
from temporality_protocol.catalog import TIMER_FIRED_HUMAN, TIMER_SCHEDULE_HUMAN

__all__ = ["arm_answer_repair", "arm_deadline", "deadline_at", "rearm_deadline", "timer_payload"]


def deadline_at(expires_at: datetime) -> datetime:
    """Schedules have whole-second resolution: round up so a deadline never fires before ``expires_at``."""
    whole = expires_at.astimezone(UTC).replace(microsecond=0)
    return whole if whole == expires_at else whole + timedelta(seconds=1)


def timer_payload(request_id: str) -> bytes:
    return json.dumps({"request_id": request_id}).encode()


async def _arm(
    bus: Bus, request_id: str, at: datetime, *, schedule_suffix: str, target_suffix: str, msg_id: str
) -> PublishResult:
    return await schedule_at(
        bus,
        schedule_subject=f"{TIMER_SCHEDULE_HUMAN}.{request_id}{schedule_suffix}",
        target_subject=f"{TIMER_FIRED_HUMAN}.{request_id}{target_suffix}",
        at=deadline_at(at),
        payload=timer_payload(request_id),
        msg_id=msg_id,
    )


async def arm_deadline(bus: Bus, request_id: str, expires_at: datetime) -> PublishResult:
    """The request's deadline; a repeat (redelivered ``human.requested``) is deduplicated by its msg id."""
    return await _arm(
        bus, request_id, expires_at, schedule_suffix="", target_suffix="", msg_id=derive_id("tmr", request_id)
    )


async def arm_answer_repair(bus: Bus, request_id: str, at: datetime) -> PublishResult:
    """A timer that announces the bound answer if its ``human.answered`` was lost (one per request)."""
    return await _arm(
        bus,
        request_id,
        at,
        schedule_suffix=".repair",
        target_suffix=".repair",
        msg_id=derive_id("tmr", request_id, "repair"),
    )


async def rearm_deadline(bus: Bus, request_id: str, at: datetime, *, cause: str) -> PublishResult:
    """The deadline again, for a timer that fired early; ``cause`` (the early firing) keys the msg id."""
    return await _arm(
        bus,
        request_id,
        at,
        schedule_suffix=".rearm",
        target_suffix="",
        msg_id=derive_id("tmr", request_id, "rearm", cause),
    )
