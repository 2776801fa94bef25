"""Schedule triggers (TRG-2, TRG-7): cron ticks as JetStream message schedules, one run per tick.

No in-process scheduler holds time. Each enabled schedule trigger has exactly one timer in the
``trigger-schedule`` namespace (key = trigger id): an ``@at`` message schedule for its *next* tick, whose
payload names the trigger, the tick time and the trigger revision it was armed for::

    store change (any replica's watch)  -> arm the next tick after now (idempotent: one schedule per
                                           subject, and the arm's Nats-Msg-Id is derived from
                                           (trigger, revision, tick)); disabled / deleted / no longer a
                                           schedule -> cancel the timer; a failed arm or cancel is retried
                                           (1 s, doubling, up to the check interval)
    tick fires (server-side, durable)   -> the ``trigger-gateway-schedules`` consumer (one replica gets it)
                                           -> the trigger as stored now: gone, disabled or re-armed for a
                                           newer revision -> nothing; else arm the next tick, then launch
                                           this one (so a launch that fails, even one dead-lettered,
                                           never ends the chain)
    every ``schedule_check_s`` (60 s)    -> each replica lists the pending schedules (one ``STREAM.INFO``)
                                           and arms the next tick of every enabled schedule trigger that
                                           has none, only if its subject is still empty then
                                           (``Nats-Expected-Last-Subject-Sequence: 0``): a check never
                                           replaces a schedule, and two replicas repairing at once arm one

Every tick is a delivery of the launch path (:class:`~.launch.Launcher`): recorded in
``trigger-deliveries`` (listed, re-drivable), then the dedupe claim, ``trigger.received`` +
``trigger.accepted`` + ``run.requested``, or ``trigger.received`` + ``trigger.rejected`` (``missed_tick``,
``filtered`` by ``when``, ``invalid_payload`` -- recorded ``mapping_failed``, its detail starting ``mapping_failed:``,
when an expression of the trigger fails on the tick --, a concurrency key's ``concurrency_skip``...). The delivery
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

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import structlog
from croniter import croniter  # type: ignore[import-untyped]
from nats.js.errors import BadRequestError
from pydantic import BaseModel, ConfigDict, ValidationError

from temporality_bus import Bus, Delivery, PermanentError, Timers, TransientError
from temporality_bus.listing import stream_subjects
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
#: The first retry of an arm or cancel that failed on a store change (seconds; doubles up to the check interval).
ARM_RETRY_S = 1.0
#: JetStream's "wrong last sequence": a conditional arm found the subject no longer empty.
_WRONG_LAST_SEQUENCE = 10071


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
        #: Ids whose arm or cancel failed on a store change: retried by :meth:`keeping_armed`'s task.
        self.unsettled: set[str] = set()
        self._failed = asyncio.Event()

    async def arm_next(
        self, trigger: ScheduleTrigger, revision: int, *, after: datetime | None = None, only_if_none: bool = False
    ) -> datetime | None:
        """Arm ``trigger``'s next tick after ``after`` (now); the same arm from several replicas is one.

        ``only_if_none``: only while the trigger has no schedule at all (its subject is empty on the server);
        ``None`` when it has one by then (armed by another replica, a tick handler or a store change). Such an arm
        has no ``Nats-Msg-Id``: the condition makes it one, and a schedule that vanished without firing (purged)
        would otherwise be armed again under the id of the arm that stored it, which the duplicate window drops."""
        at = next_tick(trigger, after or datetime.now(UTC))
        payload = Tick(trigger_id=trigger.id, at=at, revision=revision).model_dump_json().encode()
        msg_id = None if only_if_none else derive_id("sch", trigger.id, str(revision), _tick_id(at))
        write = self.timers.arm_write(trigger.id, at, payload, msg_id=msg_id)
        if only_if_none:
            write.headers["Nats-Expected-Last-Subject-Sequence"] = "0"
        try:
            await self._bus.publish_write(write)
        except TransientError as exc:
            cause = exc.__cause__
            if only_if_none and isinstance(cause, BadRequestError) and cause.err_code == _WRONG_LAST_SEQUENCE:
                return None
            raise
        log.info("schedule.armed", trigger_id=trigger.id, tick=at.isoformat(), revision=revision)
        return at

    async def on_change(self, trigger_id: str, trigger: TriggerConfig | None, revision: int) -> None:
        """A store change this replica applied: arm the trigger's next tick, or cancel its timer. One that fails
        is retried (:meth:`keeping_armed`) until it succeeds or a later change settles the trigger."""
        try:
            if isinstance(trigger, ScheduleTrigger) and trigger.enabled:
                self._scheduled.add(trigger_id)
                await self.arm_next(trigger, revision)
            elif (
                isinstance(trigger, ScheduleTrigger)
                or trigger_id in self._scheduled
                # not served (deleted, or a record this replica cannot use): it may have a timer unless it is known
                # to be of another type (a webhook trigger whose secret is not set here has none to cancel)
                or (trigger is None and self._registry.kinds.get(trigger_id, "schedule") == "schedule")
            ):
                self._scheduled.discard(trigger_id)
                await self.timers.cancel(trigger_id)
                log.info("schedule.cancelled", trigger_id=trigger_id, revision=revision)
        except Exception:
            self.unsettled.add(trigger_id)
            self._failed.set()
            raise  # logged by the registry (trigger.change_effect_failed)
        self.unsettled.discard(trigger_id)

    async def retry_unsettled(self) -> None:
        """The arm or cancel of every trigger whose last one failed, as the trigger now stands."""
        for trigger_id in sorted(self.unsettled):
            with contextlib.suppress(Exception):  # still unsettled: retried later
                await self.on_change(
                    trigger_id, self._registry.get(trigger_id), self._registry.revisions.get(trigger_id, 0)
                )
                log.info("schedule.retry_settled", trigger_id=trigger_id)

    async def arm_missing(self) -> list[str]:
        """Arm the next tick of every enabled schedule trigger this replica serves that has no schedule pending
        on the server (its tick was dead-lettered before it armed the next, an arm failed...); the ids armed.

        One ``STREAM.INFO`` lists the subjects holding a schedule (a fired schedule leaves its subject empty; a
        cancel holds it for :data:`~temporality_bus.timers.CANCEL_TTL_S`). Each arm is conditional on the subject
        still being empty, so this never replaces a schedule armed meanwhile, and replicas checking at once arm
        one."""
        enabled = [t for t in self._registry.all() if isinstance(t, ScheduleTrigger) and t.enabled]
        if not enabled:
            return []
        prefix = self.timers.schedule_subject("key").removesuffix("key")
        pending = await stream_subjects(self._bus.js, self.timers.stream, prefix + ">")
        armed: list[str] = []
        for trigger in enabled:
            if self.timers.schedule_subject(trigger.id) in pending:
                continue
            revision = self._registry.revisions.get(trigger.id, 0)
            at = await self.arm_next(trigger, revision, only_if_none=True)
            if at is not None:
                log.warning("schedule.rearmed", trigger_id=trigger.id, tick=at.isoformat(), why="no pending tick")
                armed.append(trigger.id)
        return armed

    @contextlib.asynccontextmanager
    async def keeping_armed(self, check_s: float) -> AsyncIterator[None]:
        """While inside: retry failed arms and cancels (:data:`ARM_RETRY_S`, doubling up to ``check_s``) and
        :meth:`arm_missing` every ``check_s``, the first check at once."""
        task = asyncio.create_task(self._keep_armed(check_s), name="schedule-keeper")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_armed(self, check_s: float) -> None:
        loop = asyncio.get_running_loop()
        next_check = loop.time()  # the first check at once
        retry_s = ARM_RETRY_S
        while True:
            if loop.time() >= next_check:
                try:
                    await self.arm_missing()
                except Exception as exc:  # the bus is away: checked again at the next interval
                    log.warning("schedule.check_failed", error=repr(exc))
                next_check = loop.time() + check_s
            if not self.unsettled:
                retry_s = ARM_RETRY_S
                self._failed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, next_check - loop.time())):
                        await self._failed.wait()  # a change's arm or cancel failed
                if not self.unsettled:
                    continue
            await asyncio.sleep(min(retry_s, max(0.0, next_check - loop.time())))
            await self.retry_unsettled()
            retry_s = min(retry_s * 2, check_s)

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
        # The next tick first: a launch that fails (retried, or dead-lettered when it cannot succeed) must not
        # end the chain. A redelivered tick arms the same next tick again (the same Nats-Msg-Id: one schedule).
        await self.arm_next(trigger, max(current, tick.revision), after=max(now, tick.at))
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

    async def launch_tick(self, trigger: ScheduleTrigger, at: datetime, *, now: datetime, body_bytes: int = 0) -> str:
        """One tick as a delivery of the launch path (recorded in ``trigger-deliveries``, so it is listed and
        can be re-driven): missed past its grace (policy ``skip``), refused by ``when``, or the claim then the
        concurrency key's policy. The claim recognises a redelivered tick as the same delivery."""
        delivery = _delivery(trigger, at, body_bytes)
        event = tick_event(trigger, at, now=now)
        title = tick_title(trigger, at)
        refused: tuple[RejectReason, str] | None = None
        recorded_as: str | None = None
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
            except MappingFailed as exc:  # the trigger is at fault: journaled, and the trigger keeps ticking
                refused = "invalid_payload", exc.detail("the tick")
                recorded_as = "mapping_failed"
        if refused is not None:
            reason, detail = refused
            await self._launcher.refuse(
                delivery, reason, detail, tenant=trigger.tenant, event=event, title=title, recorded_as=recorded_as
            )
            return f"rejected:{reason}"
        run_id = run_id_for_delivery(trigger.id, _tick_id(at))
        launched = await self._launcher.launch(
            delivery, event, run_id, title, mapped, with_payload=True, concurrency_key=key
        )
        return launched.status
