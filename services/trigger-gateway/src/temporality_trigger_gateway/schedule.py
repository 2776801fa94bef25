"""Schedule triggers (TRG-2, TRG-7): cron ticks as JetStream message schedules, one run per tick.

No in-process scheduler holds time. Each enabled schedule trigger has exactly one timer in the
``trigger-schedule`` namespace (key = trigger id): an ``@at`` message schedule for its *next* tick, whose
payload names the trigger, the tick time and the trigger revision it was armed for::

    store change (any replica's watch)  -> arm the next tick after now (idempotent: one schedule per
                                           subject, and the arm's Nats-Msg-Id is derived from
                                           (trigger, revision, tick)); disabled / deleted / no longer a
                                           schedule -> cancel the timer
    tick fires (server-side, durable)   -> the ``trigger-gateway-schedules`` consumer (one replica gets it)
                                           -> the trigger as stored now: gone, disabled or re-armed for a
                                           newer revision -> nothing; else launch, then arm the next tick

Every tick is a delivery of the launch path (:class:`~.launch.Launcher`): recorded in
``trigger-deliveries`` (listed, re-drivable), then the dedupe claim, ``trigger.received`` +
``trigger.accepted`` + ``run.requested``, or ``trigger.received`` + ``trigger.rejected`` (``missed_tick``,
``filtered`` by ``when``, ``invalid_payload``, a concurrency key's ``concurrency_skip``...). The delivery
id and the run id (``run_id_for_delivery(trigger id, "tick:<time>")``) derive from the tick, and every
event id from them, so a redelivered firing is the same delivery: the claim recognises it and the same
ids are published again (JetStream dedupes them; the run store refuses a second line): one run per tick
with any number of replicas.

**Missed ticks.** While the gateways (or NATS) are down nothing fires in between: the one armed tick fires
(or is delivered) late, once they are back, and only the next tick after *now* is armed again, so a
downtime over several ticks makes at most one late run. ``missed.policy`` decides what that late tick
does when it is handled more than ``missed.grace_s`` (300 s) after its time: ``run_once`` (default) starts
its run, ``skip`` journals ``trigger.rejected`` (reason ``missed_tick``) and starts none.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from croniter import croniter  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, ValidationError

from temporality_bus import Bus, Delivery, PermanentError, Timers
from temporality_protocol import Actor, NormalizedEvent, derive_id, run_id_for_delivery
from temporality_protocol.catalog import TIMER_NS_TRIGGER_SCHEDULE
from temporality_trigger_gateway.errors import BodyTooLarge
from temporality_trigger_gateway.launch import Launcher, RejectReason, TriggerDelivery
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.store import TriggerRegistry
from temporality_trigger_gateway.triggers import ScheduleTrigger, TriggerConfig

__all__ = ["ADAPTER", "Scheduler", "Tick", "next_tick", "tick_event"]

log = structlog.get_logger(__name__)

#: The ``adapter`` a tick is journaled under (``trigger.received``).
ADAPTER = "schedule"


class Tick(BaseModel):
    """The payload of one armed tick."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trigger_id: str
    at: datetime
    revision: int


# --------------------------------------------------------------------------- decisions (pure)
def next_tick(trigger: ScheduleTrigger, after: datetime) -> datetime:
    """The first tick of ``trigger.cron`` (read in its time zone) strictly after ``after``, in UTC."""
    local = after.astimezone(trigger.zone)
    following: datetime = croniter(trigger.cron, local).get_next(datetime)
    return following.astimezone(UTC)


def _tick_id(at: datetime) -> str:
    return "tick:" + at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _delivery(trigger: ScheduleTrigger, at: datetime, body_bytes: int) -> TriggerDelivery:
    source_event_id = _tick_id(at)
    return TriggerDelivery(
        trigger=trigger,
        delivery_id=derive_id("dlv", trigger.id, source_event_id),
        kind="schedule",
        adapter=ADAPTER,
        source_event_id=source_event_id,
        source_event_type="schedule.tick",
        body_bytes=body_bytes,
    )


def tick_event(trigger: ScheduleTrigger, at: datetime, *, now: datetime) -> NormalizedEvent:
    """The tick as the mapping (and a concurrency key) sees it: type ``schedule.tick``."""
    late_s = max(0.0, (now - at).total_seconds())
    return NormalizedEvent(
        id=_tick_id(at),
        type="schedule.tick",
        source=f"/temporality/schedule/{trigger.id}",
        timestamp=at,
        actor=Actor(id="system:schedule", type="system"),
        tenant=trigger.tenant,
        payload={"tick": at.isoformat(), "cron": trigger.cron, "timezone": trigger.timezone, "late_s": round(late_s)},
        metadata={"trigger_id": trigger.id},
    )


def tick_title(trigger: ScheduleTrigger, at: datetime) -> str:
    return f"{trigger.name} ({at.astimezone(trigger.zone).isoformat()})"


def _missed(trigger: ScheduleTrigger, at: datetime, now: datetime) -> bool:
    """Whether the tick is handled past its grace by a trigger whose missed policy is ``skip``."""
    return (now - at).total_seconds() > trigger.missed.grace_s and trigger.missed.policy == "skip"


def _missed_detail(trigger: ScheduleTrigger, at: datetime, now: datetime) -> str:
    late_s = max(0.0, (now - at).total_seconds())
    return (
        f"the tick of {at.isoformat()} was handled {round(late_s)} s late (grace "
        f"{trigger.missed.grace_s} s, missed policy skip)"
    )


# --------------------------------------------------------------------------- effects
class Scheduler:
    """Arms, cancels and handles the ticks of this replica's schedule triggers."""

    def __init__(self, bus: Bus, registry: TriggerRegistry, *, launcher: Launcher | None = None) -> None:
        self._bus = bus
        self._registry = registry
        #: Launches every tick: the claim, the delivery's record, then its concurrency key's policy.
        self._launcher = launcher or Launcher(bus, retry_after_s=10)
        # each tick arms the next: a new trace per tick, linked to the arming span (not one endless trace)
        self.timers = Timers(bus, TIMER_NS_TRIGGER_SCHEDULE, trace="link")
        #: Ids this replica has seen as enabled schedule triggers (a webhook trigger's change cancels nothing).
        self._scheduled: set[str] = set()

    async def arm_next(self, trigger: ScheduleTrigger, revision: int, *, after: datetime | None = None) -> datetime:
        """Arm ``trigger``'s next tick after ``after`` (now); the same arm from several replicas is one."""
        at = next_tick(trigger, after or datetime.now(UTC))
        payload = Tick(trigger_id=trigger.id, at=at, revision=revision).model_dump_json().encode()
        await self.timers.arm(trigger.id, at, payload, msg_id=derive_id("sch", trigger.id, str(revision), _tick_id(at)))
        log.info("schedule.armed", trigger_id=trigger.id, tick=at.isoformat(), revision=revision)
        return at

    async def on_change(self, trigger_id: str, trigger: TriggerConfig | None, revision: int) -> None:
        """A store change this replica applied: arm the trigger's next tick, or cancel its timer."""
        if isinstance(trigger, ScheduleTrigger) and trigger.enabled:
            self._scheduled.add(trigger_id)
            await self.arm_next(trigger, revision)
        elif trigger is None or isinstance(trigger, ScheduleTrigger) or trigger_id in self._scheduled:
            self._scheduled.discard(trigger_id)
            await self.timers.cancel(trigger_id)
            log.info("schedule.cancelled", trigger_id=trigger_id, revision=revision)

    async def handle(self, data: bytes, delivery: Delivery) -> None:
        """One fired tick (the ``trigger-gateway-schedules`` consumer): launch, then arm the next."""
        try:
            tick = Tick.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable schedule tick: {exc.error_count()} problem(s)") from exc
        trigger = self._registry.get(tick.trigger_id)
        current = self._registry.revisions.get(tick.trigger_id, 0)
        if not isinstance(trigger, ScheduleTrigger) or not trigger.enabled:
            log.info("schedule.tick_dropped", trigger_id=tick.trigger_id, reason="not an enabled schedule trigger")
            return
        if tick.revision < current:
            # armed for an older version: that change re-armed the trigger (a newer schedule replaced this
            # one on the server unless it had already fired); make sure of it and drop this tick
            log.info("schedule.tick_dropped", trigger_id=tick.trigger_id, reason="trigger changed since armed")
            await self.arm_next(trigger, current)
            return
        now = datetime.now(UTC)
        with structlog.contextvars.bound_contextvars(trigger_id=trigger.id, tick=tick.at.isoformat()):
            try:
                outcome = await self.launch_tick(trigger, tick.at, now=now, body_bytes=len(data))
            except BodyTooLarge as exc:
                raise PermanentError(exc.detail) from exc
        log.info(
            "schedule.ticked",
            trigger_id=trigger.id,
            tick=tick.at.isoformat(),
            outcome=outcome,
            late_s=round((now - tick.at).total_seconds(), 3),
        )
        await self.arm_next(trigger, max(current, tick.revision), after=max(now, tick.at))

    async def launch_tick(self, trigger: ScheduleTrigger, at: datetime, *, now: datetime, body_bytes: int = 0) -> str:
        """One tick as a delivery of the launch path (recorded in ``trigger-deliveries``, so it is listed and
        can be re-driven): missed past its grace (policy ``skip``), refused by ``when``, or the claim then the
        concurrency key's policy. The claim recognises a redelivered tick as the same delivery."""
        delivery = _delivery(trigger, at, body_bytes)
        event = tick_event(trigger, at, now=now)
        title = tick_title(trigger, at)
        refused: tuple[RejectReason, str] | None = None
        if _missed(trigger, at, now):
            refused = "missed_tick", _missed_detail(trigger, at, now)
        else:
            try:
                filtered = trigger.filtered(event)
                if filtered is not None:
                    refused = "filtered", filtered
                else:
                    mapped = trigger.agent_input(event)
                    key = trigger.concurrency_key(event)
            except MappingFailed as exc:  # journaled, and the trigger keeps ticking
                refused = "invalid_payload", f"the {exc.section} expression cannot be applied to the tick ({exc})"
        if refused is not None:
            reason, detail = refused
            await self._launcher.refuse(delivery, reason, detail, tenant=trigger.tenant, event=event, title=title)
            return f"rejected:{reason}"
        run_id = run_id_for_delivery(trigger.id, _tick_id(at))
        launched = await self._launcher.launch(
            delivery, event, run_id, title, mapped, with_payload=True, concurrency_key=key
        )
        return launched.status
