"""Durable timers as JetStream message schedules (nats-server >= 2.12).

A timer is a message on a ``…schedule…`` subject of the TIMERS stream carrying
``Nats-Schedule: @at <RFC 3339>`` and ``Nats-Schedule-Target: <fired subject>``. The server
publishes the payload to the target at that time, once, whatever restarts in between. No
``asyncio.sleep`` holds a deadline.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporality_bus.connection import Bus, PublishResult

__all__ = ["schedule_at"]


async def schedule_at(
    bus: Bus, *, schedule_subject: str, target_subject: str, at: datetime, payload: bytes, msg_id: str
) -> PublishResult:
    when = at.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    return await bus.publish_raw(
        schedule_subject,
        payload,
        {"Nats-Msg-Id": msg_id, "Nats-Schedule": f"@at {when}", "Nats-Schedule-Target": target_subject},
    )
