"""Requests parked until their run's policy is projected (SEC-1), however long that takes.

A ``human.requested`` may arrive before its run's ``run.requested`` has been projected (:mod:`.policies`).
The request consumer retries it a few times (``policy_wait_deliveries``, seconds); past that, if the
``human-interaction-policies`` consumer still has messages pending (it is catching up: an outage, a
backlog), the request is **parked** instead of being retried until the consumer's last delivery:

* ``parked.<run id>.<request id>`` in ``human-channels`` holds the event (create-if-absent), and the timer
  ``<request id>.policy`` is armed at the request's ``expires_at``; the message is acked. Nothing is
  stored or delivered yet: nobody may be asked before the policy says who may be.
* When the policy is projected, :class:`~.policies.RunPolicyHandler` (after storing it) arms the timer
  ``<request id>.policywake`` of each request parked under the run, due at once. The deadlines consumer
  hands its firing to :meth:`.requests.RequestHandler.resume_parked`, which takes the request in as if it
  had just arrived (idempotent) and removes the parked entry. The request parks before it looks at the
  policy again, and the policy handler stores the policy before it lists the parked requests, so one of the
  two sees the other: a request is never left parked next to a known policy. (The handler finds them in its
  replica's mirror of the bucket once the mirror holds the policy it stored, else by listing the bucket; a parker
  that finds no policy in its mirror reads the bucket: :mod:`.policies`.)
* If the request's deadline comes first (the ``.policy`` timer fires and the policy is still unknown), it is
  refused as before (``human.rejected`` ``recipient_not_allowed``) and the entry removed.

Both timers are durable JetStream message schedules (:mod:`.timers`): a restart of every replica loses
nothing, and the wait has no bound but the request's own deadline.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import structlog
from pydantic import ValidationError

from temporality_bus import Bus, PublishResult, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.mirror import ChannelEntry
from temporality_human_interaction.timers import human_timers
from temporality_protocol import Envelope, derive_id

__all__ = [
    "arm_wake",
    "park",
    "parked_event",
    "parked_ids",
    "parked_key",
    "parked_of_run",
    "parked_timer_payload",
    "unpark",
]

log = structlog.get_logger(__name__)

_LIST_TIMEOUT_S = 10.0


def parked_key(run_id: str, request_id: str) -> str:
    return ref_key("parked", run_id, request_id)


def parked_timer_payload(request_id: str, run_id: str, *, wake: bool) -> bytes:
    """The firing of a parked request's timer: its deadline (``wake`` false) or the policy's arrival."""
    return json.dumps({"request_id": request_id, "run_id": run_id, "parked": True, "wake": wake}).encode()


async def park(bus: Bus, event: Envelope, run_id: str, request_id: str, expires_at: datetime) -> None:
    """Keep ``event`` until its run's policy is known, and arm its deadline (both idempotent)."""
    await ChannelRefs(bus).claim(parked_key(run_id, request_id), event.model_dump_json())
    await human_timers(bus).arm(
        f"{request_id}.policy",
        expires_at,
        parked_timer_payload(request_id, run_id, wake=False),
        msg_id=derive_id("tmr", request_id, "policy"),
    )
    log.info("request.parked", until=expires_at.isoformat())


async def parked_event(bus: Bus, run_id: str, request_id: str) -> Envelope | None:
    """The parked ``human.requested`` (None: not parked, or taken in already)."""
    raw = await ChannelRefs(bus).get(parked_key(run_id, request_id))
    if raw is None:
        return None
    try:
        return Envelope.model_validate_json(raw)
    except ValidationError:
        log.error("request.parked_unreadable", run_id=run_id, request_id=request_id)
        return None


async def unpark(bus: Bus, run_id: str, request_id: str) -> None:
    await ChannelRefs(bus).delete(parked_key(run_id, request_id))


async def parked_of_run(bus: Bus, run_id: str) -> list[str]:
    """The request ids parked under ``run_id`` (a server-side filtered listing of ``parked.<run>.*``)."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    # called for every run.requested, and a request is parked only while the policies consumer lags: almost
    # always nothing to list, so no watcher is made for nothing (usually_empty)
    listed = await live_entries(kv, f"{ref_key('parked', run_id)}.*", timeout_s=_LIST_TIMEOUT_S, usually_empty=True)
    stored: list[str] = []
    for entry in listed:
        try:
            stored.append(ChannelRef.model_validate_json(entry.value or b"").value)
        except ValidationError:
            continue
    return _request_ids(stored)


def parked_ids(entries: list[ChannelEntry]) -> list[str]:
    """The request ids of parked entries as the mirror holds them (:meth:`.mirror.ChannelMirror.children`)."""
    return _request_ids([entry.value for entry in entries])


def _request_ids(parked: list[str]) -> list[str]:
    """The request ids of parked ``human.requested`` events (their JSON), sorted; unreadable ones left out."""
    found: list[str] = []
    for raw in parked:
        try:
            event = Envelope.model_validate_json(raw)
        except ValidationError:
            continue
        request_id = event.data.get("request_id")
        if isinstance(request_id, str):
            found.append(request_id)
    return sorted(found)


async def arm_wake(bus: Bus, run_id: str, request_id: str, *, cause: str) -> PublishResult:
    """Fire the parked request's wake-up at once (``cause``, the policy's event, keys it: a redelivery
    of the same ``run.requested`` arms it once)."""
    return await human_timers(bus).arm(
        f"{request_id}.policywake",
        datetime.now(UTC),
        parked_timer_payload(request_id, run_id, wake=True),
        msg_id=derive_id("tmr", request_id, "policywake", cause),
    )
