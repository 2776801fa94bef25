"""Checkpoint retention: a finished run's checkpoint is removed from KV a while after the run ended.

A checkpoint (bucket ``run-checkpoints``: the whole conversation, tool results, mail, parked calls; often
many KB) is what a run resumes and recovers from; once the run has ended nothing reads it again but a person
debugging it, and the journal keeps the run's trajectory for people anyway. So when a run reaches a
terminal state (completed, failed, cancelled) the machine asks for :class:`~.machine.ArmRetention`, and the
engine arms one durable timer (:class:`temporality_bus.Timers`, namespace ``run-retention``, key = the run
id) at the run's end + ``TEMPORALITY_EXECUTOR_CHECKPOINT_RETENTION_S`` (:data:`DEFAULT_RETENTION_S`; 0: it
fires at once). When it fires (:meth:`temporality_run_executor.engine.Engine.on_retention`) the run record
decides (:class:`~.machine.RetentionFired`): a run still finished has its checkpoint purged; anything else
(no record, a run not finished, a checkpoint already gone) changes nothing.

What stays: the run record (bucket ``runs``, small). It is what makes a replayed ``run.requested`` a
duplicate instead of a new run, and what a late answer, agent message, cancel, watchdog firing or dead letter
for the run is decided on (``run.input_after_end``, ignored): none of them needs the checkpoint.

Crash safety:

* **Armed after the end is committed**, so the timer never fires on a run that is still going. The deadline
  is computed from the record's ``updated_at`` (a finished record's state and ``updated_at`` are never
  rewritten; only ``ending.published`` is set), so every arm of a run asks for the same time, and the ``Nats-Msg-Id`` is one per run: a repeat within the timers stream's
  duplicate window is dropped, a later one replaces the schedule with the same deadline (one schedule per
  subject), which fires at once when that is past.
* **A process that dies between the end and the arm** leaves a finished run with its checkpoint and no
  timer: the message its handler was working on comes back, finds the run finished with a checkpoint, and
  arms again (every decision on a finished run whose checkpoint is still there does).
* **A redelivered firing** finds the checkpoint gone: nothing to do.
* A run that finished before this existed has no timer and keeps its checkpoint, until a message for it
  (a late answer, a replayed request) arms its retention as above.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

import structlog
from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, Timers
from temporality_bus.pipeline import Write
from temporality_protocol import derive_id
from temporality_protocol.catalog import TIMER_NS_RUN_RETENTION
from temporality_run_executor.watchdog import MAX_HORIZON, watchdog_key

__all__ = ["DEFAULT_RETENTION_S", "MAX_RETENTION_S", "CheckpointRetention", "RetentionPayload"]

log = structlog.get_logger(__name__)

#: Seconds a finished run's checkpoint is kept (3 days): a run that fails on a Friday evening can still be
#: looked into (its conversation, tool results, parked calls) on Monday morning.
DEFAULT_RETENTION_S = 3 * 24 * 3600.0
#: The longest retention (the timers stream keeps a schedule 400 days; like the watchdog's horizon).
MAX_RETENTION_S = MAX_HORIZON.total_seconds()


class RetentionPayload(BaseModel):
    """What a retention timer carries: whose checkpoint it is and when its run ended."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: Annotated[str, Field(min_length=1)]
    ended_at: datetime
    deadline: datetime


class CheckpointRetention:
    """Arms the retention timers of finished runs' checkpoints (namespace ``run-retention``)."""

    def __init__(self, bus: Bus, *, retention_s: float = DEFAULT_RETENTION_S) -> None:
        if not 0 <= retention_s <= MAX_RETENTION_S:
            raise ValueError(f"checkpoint retention must be within 0..{MAX_RETENTION_S:g} s, not {retention_s:g}")
        self._bus = bus
        self.timers = Timers(bus, TIMER_NS_RUN_RETENTION)
        self.retention_s = retention_s

    async def arm(self, run_id: str, ended_at: datetime) -> RetentionPayload:
        """Fire at ``ended_at`` + the retention (at once when that is past); one ``Nats-Msg-Id`` per run."""
        payload, write = self.arm_write(run_id, ended_at)
        result = await self._bus.publish_write(write)
        log.debug("retention.armed", deadline=payload.deadline.isoformat(), duplicate=result.duplicate)
        return payload

    def arm_write(self, run_id: str, ended_at: datetime) -> tuple[RetentionPayload, Write]:
        """:meth:`arm`'s payload and the write that arms it, for a caller that sends the write in a batch with
        others (:meth:`~temporality_bus.Pipeline.send`)."""
        payload = RetentionPayload(
            run_id=run_id, ended_at=ended_at, deadline=ended_at + timedelta(seconds=self.retention_s)
        )
        write = self.timers.arm_write(
            watchdog_key(run_id),  # the run's timer key (its id, or a hash of one that is not a subject token)
            payload.deadline,
            payload.model_dump_json().encode(),
            msg_id=derive_id("ret", run_id),
        )
        return payload, write
