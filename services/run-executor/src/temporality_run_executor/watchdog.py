"""The run watchdog: one durable timer per active run, so no run is ever left ``running`` with nobody driving it.

A JetStream message schedule (:class:`temporality_bus.Timers`, namespace ``run-watchdog``, key = the run
id) is armed whenever a driver is about to work on a run: before it moves to ``running`` (start,
recovery), before it moves to ``resuming`` (an answer, an expiry, a rejection), and at a turn boundary
when the handler's own arm is older than :data:`REARM_AFTER` (half) of its horizon -- or when it armed
none. It fires at ``now + max_compute_s + grace``: a single turn cannot legitimately take longer than the
run's whole compute budget, and the grace covers redelivery (``ack_wait``) and retry backoff, which re-arm
it on every attempt. Each arm replaces the previous one (one schedule per subject), so only the newest
fires. The payload records the checkpoint turn the arm was made at: that is the progress marker.

**Deferred arms.** Since 7 December a handler of a message's first delivery (not its last) holds its arm back
until it has worked a third of its lease, then sends it with the deadline it had when decided; a handler that
parks or ends the run first (most: in milliseconds) writes neither the arm nor the disarm. A process that dies
or freezes with its arm held back leaves its message un-acked: it is redelivered one ack wait later, and the
redelivery (which never defers) recovers the run once the lease lapses. Only a run whose horizon is at least
four leases defers, so that recovery comes long before the watchdog would have fired
(:meth:`temporality_run_executor.engine.Engine._defer_arm`).

**Re-arming at turn boundaries.** Re-arming at every turn rewrote the same timer a few milliseconds later
(issue 11: a timer write per turn in the writer, nats-server and the timers consumer). A boundary re-arms
only when the handler's last arm is older than half the horizon (``max_compute_s + grace``); the firing
does the rest: a firing that finds the run at a later turn than its payload's re-arms it from that turn's
checkpoint (its ``saved_at``: the progress), not from now. So a run stalled at a turn still fails
``max_compute_s + grace`` after that turn's checkpoint, as when every turn re-armed (the firing first
meets its progress, then the re-armed timer fails it); a healthy run whose turn spans its arm's deadline
costs one firing and one re-arm (with the defaults: a turn running across 150 s or more of the arm's
horizon), and a run whose turns keep coming re-arms about every half horizon.

When it fires (:meth:`temporality_run_executor.engine.Engine.on_watchdog`), the run record decides:

* ``waiting_for_human`` (or terminal, or gone): ignored. A run parks with its watchdog cancelled, so
  waiting for a person never counts; a firing that was already on its way is ignored here. A finished run's
  watchdog is disarmed after the end's compare-and-set, in the same pipelined batch as its terminal event, so a
  firing on a finished run whose record does not yet say that event went out (``Ending.published``) publishes it
  again from the record (the same id: deduplicated when it did go out) and disarms the watchdog -- its driver may
  have died between the end's compare-and-set and the publish; once the record says so, the firing changes
  nothing. So does an external agent's deadline firing on a finished run.
* ``pending`` / ``running`` / ``resuming`` at a later turn than the payload's: it made progress since
  the arm (its driver did not re-arm at that turn, see above, or died before it): armed again from that
  checkpoint's ``saved_at`` (a deadline already past fires at once, and fails the run as below).
* ``pending`` / ``running`` / ``resuming`` at the payload's turn: no progress for longer than its
  compute limit plus grace -- its driver is hung or gone and no message will move it. The run fails
  with ``run.failed`` reason ``stalled`` (the same deterministic event id as any failure of the run,
  so a repeat is deduplicated): the record first, then the event, like every end -- a driver that ends the
  run meanwhile wins the compare-and-set, and the watchdog then publishes nothing.

**A run parked on its external agent** (AP-5: ``waiting_for_agent`` until the agent acts on the turn) has no
watchdog but the same timer under another payload (:meth:`RunWatchdog.arm_until`, ``agent_turn`` set): its
compute budget left, from the park. Firing, it ends the wait -- the task's record is read once more, and a run
whose agent has not acted on that turn fails ``compute_timeout`` -- when the run still waits on that turn;
on a run that is being driven again (it woke, or its parking driver died before it parked) it is an ordinary
watchdog armed anew; anything else ignores it. Waking re-arms the ordinary watchdog (the same key: the
deadline is replaced).

Failing rather than re-driving is deliberate: the run's message may still be in flight somewhere (a
stopped process, a long retry), and re-driving next to it would repeat provider and tool calls; a
stalled run failed visibly can be requested again.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import structlog
from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, Timers, TransientError
from temporality_bus.pipeline import Write
from temporality_protocol import derive_id
from temporality_protocol.catalog import TIMER_NS_RUN_WATCHDOG

__all__ = ["DEFAULT_GRACE_S", "MAX_HORIZON", "REARM_AFTER", "RunWatchdog", "WatchdogPayload", "watchdog_key"]

log = structlog.get_logger(__name__)

#: Seconds a run may sit without progress beyond its compute limit before the watchdog fails it. Must
#: exceed ``ack_wait`` plus the longest retry backoff (30 s + 30 s by default), which re-arm it.
DEFAULT_GRACE_S = 300.0
#: A driving handler re-arms its run's watchdog at a turn boundary only when its own last arm is older than this
#: fraction of the horizon (``max_compute_s + grace``); see the module docstring.
REARM_AFTER = 0.5
#: A watchdog is never armed further out than this (the timers stream keeps messages 400 days).
MAX_HORIZON = timedelta(days=365)
_TOKEN = re.compile(r"^[A-Za-z0-9_=-]+$")


def _now() -> datetime:
    return datetime.now(UTC)


def watchdog_key(run_id: str) -> str:
    """The timer key of a run: its id (every id the gateway and ``derive_id`` make is one subject token),
    or a hash of it for an id that is not a subject token."""
    return run_id if _TOKEN.fullmatch(run_id) else derive_id("run", run_id)


class WatchdogPayload(BaseModel):
    """What a watchdog timer carries: whose it is and the progress marker at the arm."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: Annotated[str, Field(min_length=1)]
    #: The checkpoint turn when armed: a firing on a run still at this turn means no progress since.
    turn: Annotated[int, Field(ge=0)]
    armed_at: datetime
    deadline: datetime
    #: Set when the timer is the compute deadline of a run parked on its external agent's action for this turn
    #: (not a watchdog; payloads from before read ``None``).
    agent_turn: Annotated[int, Field(ge=1)] | None = None


class RunWatchdog:
    """Arms and cancels the watchdog timers of runs (namespace ``run-watchdog``)."""

    def __init__(self, bus: Bus, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self._bus = bus
        self.timers = Timers(bus, TIMER_NS_RUN_WATCHDOG)
        self.grace_s = grace_s

    def deadline(self, limit_s: float, now: datetime) -> datetime:
        horizon = min(timedelta(seconds=limit_s + self.grace_s), MAX_HORIZON)
        return now + horizon

    async def arm(
        self, run_id: str, *, turn: int, limit_s: float, cause: tuple[str, ...], since: datetime | None = None
    ) -> WatchdogPayload:
        """(Re-)arm the run's watchdog at ``since + limit_s + grace`` (``since``: now unless given; never later
        than now); replaces the run's previous one.

        ``cause`` (the phase and the delivery: ``("turn", "<stream seq>", "<delivery>")``) keys the
        schedule's ``Nats-Msg-Id`` with the run and turn: a repeat of this very arm is deduplicated,
        every other arm is new (and so moves the deadline).
        """
        payload, write = self.arm_write(run_id, turn=turn, limit_s=limit_s, cause=cause, since=since)
        result = await self._bus.publish_write(write)
        log.debug("watchdog.armed", turn=turn, deadline=payload.deadline.isoformat(), duplicate=result.duplicate)
        return payload

    def arm_write(
        self, run_id: str, *, turn: int, limit_s: float, cause: tuple[str, ...], since: datetime | None = None
    ) -> tuple[WatchdogPayload, Write]:
        """:meth:`arm`'s payload and the write that arms it, for a caller that sends the write in a batch with
        others (:meth:`~temporality_bus.Pipeline.send`)."""
        now = _now()
        start = now if since is None else min(since, now)
        # a deadline already past (only with ``since``) fires at once: no progress for the whole horizon
        payload = WatchdogPayload(
            run_id=run_id, turn=turn, armed_at=start, deadline=max(self.deadline(limit_s, start), now)
        )
        write = self.timers.arm_write(
            watchdog_key(run_id),
            payload.deadline,
            payload.model_dump_json().encode(),
            msg_id=derive_id("wdg", run_id, str(turn), *cause),
        )
        return payload, write

    async def arm_until(
        self, run_id: str, *, turn: int, agent_turn: int, deadline: datetime, cause: tuple[str, ...]
    ) -> WatchdogPayload:
        """Arm the run's timer (replacing its watchdog) at ``deadline``: the compute budget left to a run parked
        on its external agent's action for ``agent_turn`` (see the module docstring)."""
        payload, write = self.arm_until_write(run_id, turn=turn, agent_turn=agent_turn, deadline=deadline, cause=cause)
        result = await self._bus.publish_write(write)
        log.debug(
            "watchdog.armed_for_agent",
            agent_turn=agent_turn,
            deadline=payload.deadline.isoformat(),
            duplicate=result.duplicate,
        )
        return payload

    def arm_until_write(
        self, run_id: str, *, turn: int, agent_turn: int, deadline: datetime, cause: tuple[str, ...]
    ) -> tuple[WatchdogPayload, Write]:
        """:meth:`arm_until`'s payload and the write that arms it (see :meth:`arm_write`)."""
        now = _now()
        payload = WatchdogPayload(
            run_id=run_id, turn=turn, armed_at=now, deadline=min(deadline, now + MAX_HORIZON), agent_turn=agent_turn
        )
        write = self.timers.arm_write(
            watchdog_key(run_id),
            payload.deadline,
            payload.model_dump_json().encode(),
            msg_id=derive_id("wdg", run_id, "agent", str(agent_turn), *cause),
        )
        return payload, write

    def disarm_write(self, run_id: str) -> Write:
        """The write :meth:`disarm` publishes (see :meth:`arm_write`); its failure is for the caller to ignore."""
        return self.timers.cancel_write(watchdog_key(run_id))

    async def disarm(self, run_id: str) -> None:
        """Cancel the run's watchdog, best effort: a timer left armed fires on a run that is waiting or
        finished, which the handler ignores."""
        try:
            await self.timers.cancel(watchdog_key(run_id))
        except TransientError as exc:
            log.warning("watchdog.disarm_failed", error=str(exc))
