"""Flow control per trigger (issue 7): at most one active run per concurrency key, and what a new event does.

A trigger with ``concurrency: {key, policy}`` computes a key per event (:meth:`.triggers.Concurrency.key_of`,
e.g. repository + pull request). The state of each (trigger, key) is one record in the
``trigger-concurrency`` bucket (key ``ck-`` + hash(trigger id, key value): any key value is a valid KV key),
changed only through :meth:`temporality_bus.Store.modify` (compare-and-set), so two replicas and any
redelivery agree::

    a delivery that won its dedupe claim (launch.py), key K:
      K has no active run, or it is this very run        -> start it (active = this run)
      policy supersede                                   -> active = this run, replacing the older one:
                                                            run.cancel_requested(older, reason superseded)
                                                            published with the new run's run.requested
      policy skip                                        -> trigger.rejected(concurrency_skip), no run
      policy queue                                       -> appended to K's queue (its launch stored under
                                                            ``ql-`` + hash(run id)), trigger.received only;
                                                            a full queue (max_queued) is refused like skip
    run.completed / failed / cancelled of K's active run -> the next queued run becomes active and its
      (the trigger-gateway-events consumer)                 trigger.accepted + run.requested are published

Every transition is decided from the stored record, never from the message alone: a record that already
names this run as active (or queued) changes nothing, so a redelivered webhook never supersedes twice or
queues twice, and the ids it publishes are the same (``run.cancel_requested`` derives from the older run,
``run.requested`` from the new one). The active run remembers the run it replaced and how
(``superseded`` / ``followed``): a redelivered run end whose successor was already made active republishes
that successor's launch (same ids, deduplicated) instead of starting another one, so a process that died
between the compare-and-set and the publish loses nothing. Which key a run holds is stored under ``cr-`` +
hash(run id) before its ``run.requested`` exists, so its end finds its key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, overload

import structlog
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from temporality_bus import AlreadyExists, NotFound, PermanentError, Store, Timers, evolve
from temporality_protocol import Envelope, NormalizedEvent, RunCancelRequested, derive_id, make_event
from temporality_protocol.catalog import BUCKET_CONCURRENCY, TIMER_NS_TRIGGER_DEBOUNCE

if TYPE_CHECKING:
    from temporality_trigger_gateway.launch import Launcher, TriggerDelivery
    from temporality_trigger_gateway.triggers import TriggerConfig

__all__ = [
    "RUN_ENDS",
    "ActiveRun",
    "Debounce",
    "DebounceTimer",
    "FlowControl",
    "KeyState",
    "QueuedLaunch",
    "QueuedRef",
    "RunKey",
    "Skip",
    "Start",
    "Wait",
    "cancel_event",
    "run_key",
    "state_key",
]

log = structlog.get_logger(__name__)

#: The event types that end a run, and so release its concurrency key.
RUN_ENDS = frozenset({"run.completed", "run.failed", "run.cancelled"})
#: How many superseded or ended runs a key's record remembers.
MAX_RETIRED = 50
#: Compare-and-set attempts on one key's state: every delivery of a key writes it, so a burst of N concurrent
#: deliveries of one key needs N attempts at worst (each lost race is another delivery's write landing); past
#: this many the sender is told 503 "contended" and retries.
KEY_ATTEMPTS = 32
#: Who asks for a superseded run's cancellation (``RunCancelRequested.requested_by``).
REQUESTED_BY = "service:trigger-gateway"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActiveRun(_Record):
    """The run that holds a key, and the run it replaced: ``superseded`` (its cancellation was requested)
    or ``followed`` (it ended and this one was next in the queue)."""

    run_id: str
    delivery_id: str
    since: datetime
    replaced: str | None = None
    how: Literal["superseded", "followed"] | None = None


class QueuedRef(_Record):
    run_id: str
    delivery_id: str


class KeyState(_Record):
    """The record of one (trigger, key): its active run and the queued deliveries, oldest first."""

    trigger_id: str
    key: str
    active: ActiveRun | None = None
    queued: list[QueuedRef] = Field(default_factory=list)
    #: The latest event of a debounced trigger, waiting for its window to end (``concurrency.debounce_s``).
    debounced: QueuedRef | None = None
    #: The last runs that held the key and were superseded or ended (bounded): a late copy of one of their
    #: deliveries never takes the key back.
    retired: list[str] = Field(default_factory=list)
    updated_at: datetime


class DebounceTimer(_Record):
    """The payload of a debounce timer: the event it was armed for (the key's latest when armed)."""

    trigger_id: str
    state_key: str
    run_id: str


class RunKey(_Record):
    """Which key a flow-controlled run holds (written before its ``run.requested``)."""

    run_id: str
    trigger_id: str
    state_key: str


class QueuedLaunch(_Record):
    """What a queued delivery needs to be launched later, by whichever replica sees the active run end."""

    trigger_id: str
    delivery_id: str
    kind: Literal["webhook", "event", "schedule"]
    adapter: str
    source_event_id: str | None
    source_event_type: str | None
    body_bytes: int = 0
    depth: int = 0
    causation_id: str | None = None
    correlation_id: str | None = None
    run_id: str
    title: str
    event: NormalizedEvent
    input: dict[str, Any]
    with_payload: bool = False
    #: A rerun (:class:`.launch.TriggerDelivery`): its number, the run it runs again, who asked. Stored only on a
    #: rerun's launch (:meth:`_stored`).
    rerun: int | None = None
    rerun_of: str | None = None
    requested_by: str | None = None

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The launch's JSON without the rerun fields unless it is a rerun's: a gateway of an earlier version (a
        rolling upgrade) reads every other queued launch as before (its model forbids unknown fields)."""
        data: dict[str, Any] = handler(self)
        if self.rerun is None:
            for name in ("rerun", "rerun_of", "requested_by"):
                data.pop(name, None)
        return data


@dataclass(frozen=True)
class Start:
    """Start the run now; ``cancel`` is the older run's ``run.cancel_requested`` (supersede), if any."""

    cancel: Envelope | None = None
    superseded: str | None = None


@dataclass(frozen=True)
class Wait:
    """Queued behind ``active`` at ``position`` (1: next)."""

    active: str | None
    position: int


@dataclass(frozen=True)
class Debounce:
    """Waiting for the key's debounce window to end at ``until``; ``replaced`` is the older event it replaces."""

    until: datetime
    replaced: QueuedLaunch | None = None


@dataclass(frozen=True)
class Passed:
    """A debounce window ended on an event that is no longer its key's latest (a newer one replaced it between the
    firing's read and its compare-and-set): nothing to do -- the newer event's delivery refused it
    (``trigger.rejected`` debounced) and its own window decides the key."""


@dataclass(frozen=True)
class Skip:
    """Refused: ``active`` holds the key (``detail`` says why)."""

    active: str | None
    detail: str


# --------------------------------------------------------------------------- decisions (pure)
def state_key(trigger_id: str, key: str) -> str:
    return derive_id("ck", trigger_id, key)


def run_key(run_id: str) -> str:
    return derive_id("cr", run_id)


def launch_key(run_id: str) -> str:
    return derive_id("ql", run_id)


def cancel_event(older: str, newer: str, delivery: TriggerDelivery, *, tenant: str | None) -> Envelope:
    """``run.cancel_requested`` of a superseded run; its id derives from the older run alone, so however
    often (and by whichever newer delivery) it is published, it is one request."""
    return make_event(
        RunCancelRequested(run_id=older, reason="superseded", requested_by=REQUESTED_BY),
        source="/temporality/trigger-gateway",
        id=derive_id("evt", RunCancelRequested.EVENT_TYPE, older, "superseded"),
        run_id=older,
        correlation_id=older,
        causation_id=derive_id("evt", delivery.delivery_id, "received"),
        actor=REQUESTED_BY,
        tenant=tenant,
        subject=newer,
    )


def _admit(
    state: KeyState, *, policy: str, max_queued: int, run_id: str, delivery_id: str, now: datetime, fired: bool = False
) -> KeyState:
    """The key's next record when ``run_id`` arrives (the same object: nothing to change). ``fired``: its
    debounce window ended (it must still be the key's debounced event; a newer one arrived: nothing)."""
    if fired:
        if state.debounced is None or state.debounced.run_id != run_id:
            return state
        state = evolve(state, debounced=None, updated_at=now)
    if state.active is not None and state.active.run_id == run_id:
        return state  # this very run again (a redelivery): already active
    if any(q.run_id == run_id for q in state.queued) or run_id in state.retired:
        return state  # already queued, or it held the key already (a late copy)
    if state.active is None:
        return evolve(state, active=ActiveRun(run_id=run_id, delivery_id=delivery_id, since=now), updated_at=now)
    if policy == "supersede":
        active = ActiveRun(
            run_id=run_id, delivery_id=delivery_id, since=now, replaced=state.active.run_id, how="superseded"
        )
        return evolve(state, active=active, retired=_retire(state, state.active.run_id), updated_at=now)
    if policy == "queue" and len(state.queued) < max_queued:
        queued = [*state.queued, QueuedRef(run_id=run_id, delivery_id=delivery_id)]
        return evolve(state, queued=queued, updated_at=now)
    return state  # skip (or a full queue)


def _debounce(state: KeyState, *, run_id: str, delivery_id: str, now: datetime) -> KeyState:
    """The key's next record when ``run_id`` arrives at a debounced trigger: it is the latest event now."""
    if state.debounced is not None and state.debounced.run_id == run_id:
        return state
    if (
        (state.active is not None and state.active.run_id == run_id)
        or any(q.run_id == run_id for q in state.queued)
        or run_id in state.retired
    ):
        return state  # its window already ended (a late redelivery)
    return evolve(state, debounced=QueuedRef(run_id=run_id, delivery_id=delivery_id), updated_at=now)


def _release(state: KeyState, *, ended: str, now: datetime, retire: bool = True) -> KeyState:
    """The key's next record when run ``ended`` ended (the same object: it was not the active run).
    ``retire``: remember it as a run that held the key (not for a queued run dropped before it started: a copy
    of its event, sent again, may take the key)."""
    if state.active is None or state.active.run_id != ended:
        return state
    retired = _retire(state, ended) if retire else [r for r in state.retired if r != ended]
    if not state.queued:
        return evolve(state, active=None, retired=retired, updated_at=now)
    following, *rest = state.queued
    active = ActiveRun(
        run_id=following.run_id, delivery_id=following.delivery_id, since=now, replaced=ended, how="followed"
    )
    return evolve(state, active=active, queued=rest, retired=retired, updated_at=now)


def _retire(state: KeyState, run_id: str) -> list[str]:
    return [*(r for r in state.retired if r != run_id), run_id][-MAX_RETIRED:]


# --------------------------------------------------------------------------- effects
class FlowControl:
    """The ``trigger-concurrency`` bucket's effects for one replica (through the launcher's bus calls)."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher
        self.timers = Timers(launcher.bus, TIMER_NS_TRIGGER_DEBOUNCE)
        self._states: Store[KeyState] | None = None
        self._runs: Store[RunKey] | None = None
        self._launches: Store[QueuedLaunch] | None = None

    async def _open(self) -> tuple[Store[KeyState], Store[RunKey], Store[QueuedLaunch]]:
        if self._states is None or self._runs is None or self._launches is None:
            bus, io = self._launcher.bus, self._launcher.io
            self._states = await io(bus.store(BUCKET_CONCURRENCY, KeyState))
            self._runs = await io(bus.store(BUCKET_CONCURRENCY, RunKey))
            self._launches = await io(bus.store(BUCKET_CONCURRENCY, QueuedLaunch))
        return self._states, self._runs, self._launches

    @overload
    async def admit(
        self, delivery: TriggerDelivery, launch: QueuedLaunch, key: str, *, fired: Literal[False] = False
    ) -> Start | Wait | Skip | Debounce: ...

    @overload
    async def admit(
        self, delivery: TriggerDelivery, launch: QueuedLaunch, key: str, *, fired: Literal[True]
    ) -> Start | Wait | Skip | Passed: ...

    async def admit(
        self, delivery: TriggerDelivery, launch: QueuedLaunch, key: str, *, fired: bool = False
    ) -> Start | Wait | Skip | Debounce | Passed:
        """Decide (compare-and-set on the key's record) whether ``launch``'s run starts, waits or is refused.

        A trigger with ``debounce_s`` first holds the event as its key's latest (:class:`Debounce`) and
        re-arms the key's timer; ``fired`` is that window's end (:meth:`fire`), deciding under the policy --
        unless a newer event replaced it meanwhile (:class:`Passed`: the newer one's delivery refused it)."""
        trigger = delivery.trigger
        flow = trigger.concurrency
        assert flow is not None
        states, runs, launches = await self._open()
        io = self._launcher.io
        if (flow.policy == "queue" or flow.debounce_s is not None) and not fired:
            # stored before it can be queued or debounced: whoever starts it later reads it
            await self._create(launches, launch_key(launch.run_id), launch)
        where = state_key(trigger.id, key)
        now = datetime.now(UTC)
        if flow.debounce_s is not None and not fired:
            return await self._debounce(states, launches, where, trigger.id, key, launch, flow.debounce_s, now)
        #: (fired) whether a newer event was the key's debounced one in the state the decision was made on (not
        #: none: a firing redelivered after its own decision cleared it decides again, e.g. republishes its skip)
        replaced = [False]

        def step(state: KeyState) -> KeyState:
            replaced[0] = state.debounced is not None and state.debounced.run_id != launch.run_id
            return _admit(
                state,
                policy=flow.policy,
                max_queued=flow.max_queued,
                run_id=launch.run_id,
                delivery_id=launch.delivery_id,
                now=now,
                fired=fired,
            )

        stored = await io(
            states.modify(
                where,
                step,
                attempts=KEY_ATTEMPTS,
                create=lambda: KeyState(trigger_id=trigger.id, key=key, updated_at=now),
            )
        )
        state = stored.value
        active = state.active
        if active is not None and active.run_id == launch.run_id:
            await self._create(
                runs, run_key(launch.run_id), RunKey(run_id=launch.run_id, trigger_id=trigger.id, state_key=where)
            )
            if active.how == "superseded" and active.replaced is not None:
                cancel = cancel_event(active.replaced, launch.run_id, delivery, tenant=launch.event.tenant)
                log.info("concurrency.superseding", key=key, superseded=active.replaced)
                return Start(cancel=cancel, superseded=active.replaced)
            return Start()
        for position, queued in enumerate(state.queued, start=1):
            if queued.run_id == launch.run_id:
                log.info("concurrency.queued", key=key, position=position, active_run_id=active and active.run_id)
                return Wait(active=active.run_id if active else None, position=position)
        holder = active.run_id if active is not None else None
        if fired and replaced[0]:  # no longer the key's latest: the newer event's delivery refused it
            log.info("concurrency.debounce_passed", key=key, run_id=launch.run_id)
            return Passed()
        if launch.run_id in state.retired:
            detail = f"run {launch.run_id} already held concurrency key {key!r} and was superseded or ended"
        elif flow.policy == "queue":
            detail = f"the queue of concurrency key {key!r} is full ({flow.max_queued} waiting behind run {holder})"
        else:
            detail = f"run {holder} of concurrency key {key!r} is active (policy skip)"
        log.info("concurrency.skipped", key=key, active_run_id=holder)
        return Skip(active=holder, detail=detail)

    async def _debounce(
        self,
        states: Store[KeyState],
        launches: Store[QueuedLaunch],
        where: str,
        trigger_id: str,
        key: str,
        launch: QueuedLaunch,
        window_s: int,
        now: datetime,
    ) -> Debounce:
        """Hold ``launch`` as the key's latest event and (re-)arm the key's timer at now + the window."""
        io = self._launcher.io
        seen: list[QueuedRef | None] = [None]

        def step(state: KeyState) -> KeyState:
            seen[0] = state.debounced  # the event this one replaces (the attempt that is written counts)
            return _debounce(state, run_id=launch.run_id, delivery_id=launch.delivery_id, now=now)

        stored = await io(
            states.modify(
                where,
                step,
                create=lambda: KeyState(trigger_id=trigger_id, key=key, updated_at=now),
                attempts=KEY_ATTEMPTS,
            )
        )
        until = now + timedelta(seconds=window_s)
        if stored.value.debounced is None or stored.value.debounced.run_id != launch.run_id:
            return Debounce(until=until)  # its window already ended (a late redelivery): nothing to arm
        timer = DebounceTimer(trigger_id=trigger_id, state_key=where, run_id=launch.run_id)
        # armed on every delivery (a redelivery after a crash between the write and the arm arms it); the
        # msg id is per event: a repeat of one arm is one schedule, a newer event's arm replaces the older
        payload = timer.model_dump_json().encode()
        await io(self.timers.arm(where, until, payload, msg_id=derive_id("deb", launch.run_id)))
        replaced: QueuedLaunch | None = None
        older = seen[0]
        if stored.changed and older is not None and older.run_id != launch.run_id:
            found = await io(launches.get(launch_key(older.run_id)))
            replaced = found.value if found is not None else None
        log.info("concurrency.debounced", key=key, until=until.isoformat(), replaced=older.run_id if older else None)
        return Debounce(until=until, replaced=replaced)

    async def fire(self, data: bytes, triggers: Callable[[str], TriggerConfig | None]) -> None:
        """A debounce window ended (the ``trigger-gateway-debounce`` consumer): launch the key's latest event
        under the trigger's policy, unless a newer event re-armed the window meanwhile."""
        try:
            timer = DebounceTimer.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable debounce timer: {exc.error_count()} problem(s)") from exc
        states, _, launches = await self._open()
        io = self._launcher.io
        state = await io(states.get(timer.state_key))
        if state is None:
            log.info("concurrency.debounce_dropped", run_id=timer.run_id, reason="the key's record is gone")
            return
        current = state.value
        pending = current.debounced is not None and current.debounced.run_id == timer.run_id
        started = current.active is not None and current.active.run_id == timer.run_id  # a redelivered firing
        if not (pending or started):
            if current.debounced is not None:
                await self._rearm_for_latest(timer, current, triggers)
            else:
                log.info("concurrency.debounce_dropped", run_id=timer.run_id, reason="decided")
            return
        found = await io(launches.get(launch_key(timer.run_id)))
        trigger = triggers(timer.trigger_id)
        if started and (found is None or trigger is None):
            log.info("concurrency.debounce_dropped", run_id=timer.run_id, reason="started already")
            return
        ref = current.debounced if pending and current.debounced is not None else None
        if found is None or trigger is None:
            assert ref is not None
            await self._drop(timer.trigger_id, ref, None if found is None else found.value, "debounced")
            return
        if trigger.concurrency is None:  # no longer flow-controlled: nothing to wait for, it starts
            log.info("concurrency.no_longer_keyed", run_id=timer.run_id, trigger_id=trigger.id)
            await self._launcher.start_queued(found.value, trigger)
            return
        await self._launcher.launch_debounced(found.value, trigger, current.key)

    async def _drop(self, trigger_id: str, ref: QueuedRef, launch: QueuedLaunch | None, waiting: str) -> None:
        """A waiting delivery that will never start (:meth:`Launcher.drop_waiting`): its trigger was deleted
        (journaled ``disabled``), or its stored launch is gone (journaled ``launch_lost``)."""
        if launch is None:
            detail = (
                f"the delivery was {waiting} under its concurrency key and its stored launch (run {ref.run_id}) is "
                "gone (expired from the trigger-concurrency bucket after 7 days, or deleted): no run starts; "
                "re-drive the delivery to start it"
            )
            await self._launcher.drop_waiting(trigger_id, ref, None, reason="launch_lost", detail=detail)
            return
        detail = f"trigger {trigger_id} was deleted while the delivery was {waiting} under its concurrency key"
        await self._launcher.drop_waiting(trigger_id, ref, launch, reason="disabled", detail=detail)

    async def _rearm_for_latest(
        self, timer: DebounceTimer, current: KeyState, triggers: Callable[[str], TriggerConfig | None]
    ) -> None:
        """A firing for an event that is no longer its key's latest (``current.debounced`` is newer).

        Each delivery compare-and-sets itself as the key's latest, then arms the key's one schedule (the last
        arm replaces the others): the two steps are not atomic, so two concurrent events can arm in the
        other order than they were compare-and-set, leaving the key's schedule to the older one. Dropping
        this firing would then lose the latest event for good (its own arm was replaced). So the window is
        armed again for the latest, at its end as the stored record says (the record's ``updated_at`` is when
        the latest was set; a later change of the record only moves it later): if the latest's own arm is
        still in place, this replaces it with the same firing, at worst a little later; either way it fires
        once, and the launch itself stays a compare-and-set (:meth:`admit` with ``fired``)."""
        latest = current.debounced
        assert latest is not None
        trigger = triggers(timer.trigger_id)
        flow = trigger.concurrency if trigger is not None else None
        if flow is None or flow.debounce_s is None:
            log.info("concurrency.debounce_dropped", run_id=timer.run_id, reason="the trigger is no longer debounced")
            return
        until = max(datetime.now(UTC), current.updated_at + timedelta(seconds=flow.debounce_s))
        payload = DebounceTimer(trigger_id=timer.trigger_id, state_key=timer.state_key, run_id=latest.run_id)
        # a msg id of its own (the latest's arm used derive_id("deb", run)); a redelivery of this firing repeats it
        await self._launcher.io(
            self.timers.arm(
                timer.state_key,
                until,
                payload.model_dump_json().encode(),
                msg_id=derive_id("deb", latest.run_id, "after", timer.run_id),
            )
        )
        log.info("concurrency.debounce_rearmed", stale=timer.run_id, latest=latest.run_id, until=until.isoformat())

    async def release(self, ended: str, triggers: Callable[[str], TriggerConfig | None]) -> None:
        """Run ``ended`` ended: if it held a key, the next queued run of that key starts (exactly once).

        ``triggers`` looks a trigger up as this replica serves it now. A queued delivery whose trigger was deleted
        is refused (``trigger.rejected(disabled)``, its record ``rejected``, its dedupe claim released), one whose
        stored launch is gone likewise with ``launch_lost`` (re-drivable from its record), and the next one starts
        instead; one whose trigger is no longer flow-controlled starts."""
        states, runs, launches = await self._open()
        io = self._launcher.io
        retire = True  # (False: ``ended`` is a queued run dropped before it started)
        for _ in range(100):  # a queued launch whose record expired is skipped: release it in turn (bounded)
            held = await io(runs.get(run_key(ended)))
            if held is None:
                return  # not a flow-controlled run (or its key expired)
            where = held.value.state_key
            now = datetime.now(UTC)
            try:
                stored = await io(
                    states.modify(
                        where, functools.partial(_release, ended=ended, now=now, retire=retire), attempts=KEY_ATTEMPTS
                    )
                )
            except NotFound:
                return  # the key's record expired
            active = stored.value.active
            if active is None or active.replaced != ended or active.how != "followed":
                if stored.changed:
                    log.info("concurrency.released", run_id=ended, trigger_id=held.value.trigger_id)
                return
            trigger_id = held.value.trigger_id
            await self._create(
                runs, run_key(active.run_id), RunKey(run_id=active.run_id, trigger_id=trigger_id, state_key=where)
            )
            found = await io(launches.get(launch_key(active.run_id)))
            trigger = triggers(trigger_id)
            if found is None or trigger is None:
                ref = QueuedRef(run_id=active.run_id, delivery_id=active.delivery_id)
                await self._drop(trigger_id, ref, None if found is None else found.value, "queued")
                ended, retire = active.run_id, False  # as if it had ended, never started: the next one starts
                continue
            # (a trigger no longer flow-controlled starts it too: nothing to wait for any more)
            await self._launcher.start_queued(found.value, trigger)
            log.info("concurrency.dequeued", run_id=active.run_id, after=ended, trigger_id=trigger_id)
            return

    async def _create(self, store: Store[Any], key: str, value: BaseModel) -> None:
        try:
            await self._launcher.io(store.create(key, value))
        except AlreadyExists:
            pass
