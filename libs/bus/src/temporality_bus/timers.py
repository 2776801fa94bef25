"""Durable timers as JetStream message schedules (nats-server >= 2.12, ADR-51).

A timer is a message on ``temporality.timers.schedule.<namespace>.<key>`` in the TIMERS stream
carrying ``Nats-Schedule: @at <RFC 3339>`` and ``Nats-Schedule-Target:
temporality.timers.fired.<namespace>.<target key>``. The server publishes the payload to the
target at that time, once, whatever restarts in between, and then removes the schedule. No
``asyncio.sleep`` holds a deadline.

How the server treats schedules (ADR-51; each one is proved by ``libs/bus/tests/test_timers.py``
against the real server):

* **One schedule per subject.** A schedule is stored as a rollup (``Nats-Rollup: sub``) message: a
  newer schedule on the same subject *replaces* the older one, which then never fires. That is
  :meth:`Timers.rearm` (and why one key is one timer).
* **Cancel = replace the schedule message** with a rollup that schedules nothing and expires itself
  (``Nats-Rollup: sub`` + ``Nats-TTL``, :meth:`Timers.cancel`): a publish to the key's own subject, so a
  service's NATS user cancels only its own timers. A timer that already fired has nothing to replace.
* **``Nats-Msg-Id`` dedupes a schedule like any message** (the stream's duplicate window): a repeat
  of the same arm (a redelivered handler) is dropped, but so is a *different* arm that reuses the
  id: give every distinct arm its own id (or none).
* **Whole seconds.** ``@at`` takes whole seconds; :func:`fire_time` rounds *up*, so a timer never
  fires before the time asked for. A time in the past fires at once.
* **Headers travel**: the server copies the schedule's other headers onto the fired message. A timer
  armed inside a span carries its trace context that way and the consumer continues it when it fires
  (:mod:`temporality_bus.tracing`, ``TimerTrace``).
* The fired message lands in the same stream (consume it with a JetStream consumer filtered on
  :attr:`Timers.fired_filter`); it carries ``Nats-Scheduler`` (the schedule subject), which only the server
  sets (it refuses a schedule carrying one).
* **A schedule may target any subject of the stream**: the server does not hold the target against the
  publisher's permissions, so a service could fire onto another service's timers from its own namespace.
  :func:`checking_firings` wraps a firing's handler to refuse such a firing (``Nats-Scheduler`` of another
  service's namespace: :func:`temporality_bus.provenance.forged_firing`); the service runtime wraps every
  raw handler with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import nats.errors
import structlog
from nats.js import api as jsapi
from nats.js.errors import BadRequestError, NotFoundError

from temporality_bus.connection import Bus, PublishResult
from temporality_bus.consumer import Delivery, RawHandler
from temporality_bus.errors import TransientError
from temporality_bus.listing import stream_subjects
from temporality_bus.pipeline import Write
from temporality_bus.provenance import ForgedEvent, SourceCheck, forged_firing
from temporality_bus.tracing import TimerTrace, timer_headers
from temporality_protocol.catalog import (
    LEGACY_TIMERS_STREAM,
    TIMER_FIRED_PREFIX,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAMS,
    StreamSpec,
    subject_matches,
    timers_stream_of,
)

__all__ = [
    "CANCEL_TTL_S",
    "LEGACY_PARKED_SUBJECT",
    "LegacyMigration",
    "Timers",
    "checking_firings",
    "fire_time",
    "migrate_legacy_timers",
    "parse_fired_subject",
    "schedule_at",
    "schedule_write",
]

log = structlog.get_logger(__name__)

#: How long a cancel's rollup stays on the schedule subject before the server removes it (seconds).
CANCEL_TTL_S = 60

_TOKEN = r"[A-Za-z0-9_=-]+"
_NAMESPACE = re.compile(rf"^{_TOKEN}$")
#: A key is one or more subject tokens (``hr-1``, ``hr-1.repair``): no wildcards, spaces or empty tokens.
_KEY = re.compile(rf"^{_TOKEN}(\.{_TOKEN})*$")
_FIRED = re.compile(rf"^{re.escape(TIMER_FIRED_PREFIX)}\.(?P<ns>{_TOKEN})\.(?P<key>{_TOKEN}(\.{_TOKEN})*)$")


def fire_time(at: datetime) -> datetime:
    """``at`` in UTC rounded *up* to the whole second (schedules' resolution): never earlier than ``at``."""
    if at.tzinfo is None:
        raise ValueError("a timer needs an aware datetime (UTC or with an offset), not a naive one")
    utc = at.astimezone(UTC)
    whole = utc.replace(microsecond=0)
    return whole if whole == utc else whole + timedelta(seconds=1)


def _rfc3339(at: datetime) -> str:
    return fire_time(at).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_fired_subject(subject: str) -> tuple[str, str]:
    """``temporality.timers.fired.<namespace>.<key>`` -> ``(namespace, key)``; :class:`ValueError` otherwise."""
    match = _FIRED.fullmatch(subject)
    if match is None:
        raise ValueError(f"{subject!r} is not a fired-timer subject ({TIMER_FIRED_PREFIX}.<namespace>.<key>)")
    return match["ns"], match["key"]


def checking_firings(handler: RawHandler, mode: SourceCheck) -> RawHandler:
    """``handler``, which never sees a forged timer firing (:func:`~temporality_bus.provenance.forged_firing`
    under ``mode``): :class:`~temporality_bus.provenance.ForgedEvent` instead, which the consumer runner
    dead-letters and journals (``bus.dead_lettered``) without telling the service. Other messages pass."""
    if mode == "off":
        return handler

    async def checked(data: bytes, delivery: Delivery) -> None:
        forged = forged_firing(delivery.subject, delivery.msg.headers, mode)
        if forged is not None:
            raise ForgedEvent(forged)
        await handler(data, delivery)

    return checked


async def schedule_at(
    bus: Bus,
    *,
    schedule_subject: str,
    target_subject: str,
    at: datetime,
    payload: bytes,
    msg_id: str | None,
    trace: TimerTrace = "continue",
) -> PublishResult:
    """Publish one ``@at`` schedule (rounded up to the second, see :func:`fire_time`).

    The low-level form of :meth:`Timers.arm` for arbitrary subjects of a stream that allows schedules.
    ``trace``: what the firing does with the current span's context (:data:`~temporality_bus.tracing.TimerTrace`).
    """
    write = schedule_write(
        schedule_subject=schedule_subject,
        target_subject=target_subject,
        at=at,
        payload=payload,
        msg_id=msg_id,
        trace=trace,
    )
    return await bus.publish_write(write)


def schedule_write(
    *,
    schedule_subject: str,
    target_subject: str,
    at: datetime,
    payload: bytes,
    msg_id: str | None,
    trace: TimerTrace = "continue",
) -> Write:
    """The write :func:`schedule_at` publishes, for a caller that sends it in a batch with others
    (:meth:`~temporality_bus.Pipeline.send`: one buffer, one round trip)."""
    headers = timer_headers(trace)
    headers |= {"Nats-Schedule": f"@at {_rfc3339(at)}", "Nats-Schedule-Target": target_subject}
    if msg_id is not None:
        headers["Nats-Msg-Id"] = msg_id
    return Write(schedule_subject, payload, headers)


class Timers:
    """The timers of one namespace (one purpose: ``human``, later ``heartbeat``, ``renotify`` …).

    A ``key`` names one timer: ``arm``/``rearm`` of a key replace its schedule, ``cancel`` removes
    it. By default a key fires onto its own fired subject; ``target_key`` lets several schedules
    fire onto one subject (e.g. a re-armed deadline under ``<id>.rearm`` firing as ``<id>``).

    ``trace``: a timer armed inside a span continues that trace when it fires (``continue``, the default);
    ``link`` for timers that re-arm themselves for ever (each firing a new trace linked to the arming
    span); ``none`` for a namespace whose handler continues a context it stored itself.
    """

    def __init__(
        self, bus: Bus, namespace: str, *, stream: StreamSpec | None = None, trace: TimerTrace = "continue"
    ) -> None:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"timer namespace {namespace!r} must be one subject token ([A-Za-z0-9_=-]+)")
        if stream is None:
            try:
                name = timers_stream_of(namespace)
            except KeyError:
                raise ValueError(
                    f"timer namespace {namespace!r} is no service's (ServiceSpec.timers): pass the stream holding it"
                ) from None
        else:
            if not any(subject_matches(s, f"{TIMER_SCHEDULE_PREFIX}.{namespace}.key") for s in stream.subjects):
                raise ValueError(f"stream {stream.name} does not hold the timer namespace {namespace!r}")
            name = stream.name
        self._bus = bus
        self.namespace = namespace
        #: The name of the stream holding this namespace's schedules and firings (its owner's timers stream).
        self.stream = name
        self.trace: TimerTrace = trace

    # ------------------------------------------------------------------ subjects
    @staticmethod
    def _checked(key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ValueError(f"timer key {key!r} must be dot-separated subject tokens ([A-Za-z0-9_=-]+)")
        return key

    def schedule_subject(self, key: str) -> str:
        return f"{TIMER_SCHEDULE_PREFIX}.{self.namespace}.{self._checked(key)}"

    def fired_subject(self, key: str) -> str:
        return f"{TIMER_FIRED_PREFIX}.{self.namespace}.{self._checked(key)}"

    @property
    def fired_filter(self) -> str:
        """The filter subject of a consumer of this namespace's firings."""
        return f"{TIMER_FIRED_PREFIX}.{self.namespace}.>"

    def key_of(self, fired_subject: str) -> str:
        """The key a fired subject belongs to; :class:`ValueError` for another namespace or no timer at all."""
        namespace, key = parse_fired_subject(fired_subject)
        if namespace != self.namespace:
            raise ValueError(f"{fired_subject!r} is a timer of namespace {namespace!r}, not {self.namespace!r}")
        return key

    # ------------------------------------------------------------------ operations
    async def arm(
        self,
        key: str,
        at: datetime,
        payload: bytes,
        *,
        msg_id: str | None = None,
        target_key: str | None = None,
    ) -> PublishResult:
        """Fire ``payload`` onto ``fired_subject(target_key or key)`` at ``at`` (rounded up to the second).

        Replaces any schedule the key already has. ``msg_id`` makes a repeat of this very arm a no-op
        within the stream's duplicate window (``duplicate=True``); never reuse it for a different arm.
        """
        write = self.arm_write(key, at, payload, msg_id=msg_id, target_key=target_key)
        return await self._bus.publish_write(write)

    def arm_write(
        self, key: str, at: datetime, payload: bytes, *, msg_id: str | None = None, target_key: str | None = None
    ) -> Write:
        """The write :meth:`arm` publishes, for a caller that sends it in a batch with others
        (:meth:`~temporality_bus.Pipeline.send`)."""
        return schedule_write(
            schedule_subject=self.schedule_subject(key),
            target_subject=self.fired_subject(target_key if target_key is not None else key),
            at=at,
            payload=payload,
            msg_id=msg_id,
            trace=self.trace,
        )

    async def rearm(
        self,
        key: str,
        at: datetime,
        payload: bytes,
        *,
        msg_id: str | None = None,
        target_key: str | None = None,
    ) -> PublishResult:
        """Move the key's timer to ``at`` (or arm it again after it fired): the new schedule replaces the
        old one atomically on the server, so it fires once, at the new time. ``msg_id`` must differ
        from the one the timer was first armed with, or the duplicate window swallows the rearm."""
        return await self.arm(key, at, payload, msg_id=msg_id, target_key=target_key)

    async def cancel(self, key: str) -> None:
        """Remove the key's schedule, if it has one (never armed, already fired or cancelled: nothing changes).
        A firing already published is not taken back.

        A publish to the key's own schedule subject, not a purge: a rollup (``Nats-Rollup: sub``) without a
        schedule replaces the schedule message, so it never fires, and expires itself after
        :data:`CANCEL_TTL_S` (``Nats-TTL``). Arming the key again replaces it in turn. Its NATS user needs
        nothing beyond publishing to its own namespace (a purge's filter is in the payload: a purge right
        would let it cancel every service's timers)."""
        write = self.cancel_write(key)
        try:
            await self._bus.publish_write(write)
        except TransientError as exc:
            raise TransientError(f"cancelling timer {write.subject} failed: {exc}") from exc

    def cancel_write(self, key: str) -> Write:
        """The write :meth:`cancel` publishes, for a caller that sends it in a batch with others."""
        return Write(self.schedule_subject(key), b"", {"Nats-Rollup": "sub", "Nats-TTL": f"{CANCEL_TTL_S}s"})


# ---------------------------------------------------------------------------------------------- upgrading
#: Where the legacy stream's subjects are moved first, so the per-service streams can take ``temporality.timers.>``
#: (nothing publishes there: the stored schedules and firings keep their subjects).
LEGACY_PARKED_SUBJECT = "temporality.timers-legacy.>"
#: The key under which a legacy firing no consumer had taken yet is armed again (at once) in its new stream:
#: ``<namespace>.legacy-firing.<its sequence in the legacy stream>``.
LEGACY_FIRING_KEY = "legacy-firing"
#: Headers of a legacy message that are not copied: the server's and the dedupe id (a copy gets its own).
_NOT_COPIED = ("Nats-Msg-Id", "Nats-Scheduler", "Nats-Schedule-Next", "Nats-TTL", "Nats-Rollup", "Nats-Expected-")


@dataclass(frozen=True)
class LegacyMigration:
    """What :func:`migrate_legacy_timers` moved out of the legacy ``TEMPORALITY_TIMERS`` stream."""

    #: Schedules armed in the legacy stream, armed again (same subject, time and payload) in their new stream.
    schedules: int
    #: Firings stored in the legacy stream that a consumer had not acknowledged yet, fired again in the new stream.
    firings: int
    #: Copies not made: the subject already had a message in the new stream (a concurrent migration, or a
    #: service armed or cancelled that key since), or a firing no consumer reads (nobody would take it).
    skipped: int


def _copied_headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (headers or {}).items() if not k.startswith(_NOT_COPIED)}


def _fired_by(consumer: jsapi.ConsumerInfo, subject: str) -> bool:
    filters = [*(consumer.config.filter_subjects or ()), consumer.config.filter_subject or ""]
    return any(f and subject_matches(f, subject) for f in filters) or not any(filters)


async def migrate_legacy_timers(bus: Bus, streams: Iterable[StreamSpec] | None = None) -> LegacyMigration | None:
    """Move the timers of the one ``TEMPORALITY_TIMERS`` stream of older releases into the per-service timers
    streams (``streams``, default every service's: :data:`~temporality_protocol.catalog.TIMERS_STREAMS`), then
    delete it; ``None`` when there is no legacy stream (nothing to do, the usual case).

    Needs the NATS user ``timers-migrate`` (``temporality_protocol.permissions.timers_migration_permissions``:
    ``temporality timers-migrate``, the chart's Job, compose's one-shot), one that may do everything (``temporality
    up``'s admin), or none (``temporality up --no-nats-auth``, where each service runs it at start): it publishes on
    every service's schedule subjects and deletes a stream. Safe to run again, and concurrently:

    1. the legacy stream's subjects move to :data:`LEGACY_PARKED_SUBJECT`, freeing ``temporality.timers.>``
       (its stored messages keep their subjects, and its schedules keep firing into it meanwhile): from here
       on, an older release's pod still running stores no arm there (until step 3 its arm is refused, and its
       handler retries it; afterwards the arm lands in the new stream);
    2. the pending schedules (the last message of each schedule subject, when it is a schedule) are read --
       after the move, so an arm stored just before it is among them; all of them, however many
       (:func:`~temporality_bus.listing.stream_subjects` reads past the server's 100,000 subjects per answer);
    3. the per-service streams are created where missing (with ``bus``'s settings; their services apply their
       own at their next start);
    4. each schedule is armed again on its subject in its new stream, same time, target, payload and headers,
       unless that subject already has a message there (``Nats-Expected-Last-Subject-Sequence: 0``);
    5. each firing stored in the legacy stream after the acknowledged floor of a consumer that reads it fires
       again in the new stream, at once, from ``<namespace>.legacy-firing.<seq>``;
    6. the legacy stream is deleted, with its consumers (their durables live on in the new streams).

    A timer never goes missing; one that fires during the migration may fire twice (at-least-once, like
    every delivery: the timer handlers are idempotent). Raises :class:`TransientError` when a step fails
    (nothing is deleted then: run it again)."""
    try:
        return await _migrate(bus, list(TIMERS_STREAMS.values() if streams is None else streams))
    except TransientError:
        raise
    except (nats.errors.Error, OSError) as exc:
        raise TransientError(f"migrating the legacy timers stream failed (run it again): {exc!r}") from exc


async def _migrate(bus: Bus, targets: list[StreamSpec]) -> LegacyMigration | None:
    legacy = LEGACY_TIMERS_STREAM.name
    try:
        info = await bus.js.stream_info(legacy)
    except NotFoundError:
        return None
    # 1. free temporality.timers.> for the per-service streams: the legacy stream takes no new arm from here on
    if info.config.subjects != [LEGACY_PARKED_SUBJECT]:
        info.config.subjects = [LEGACY_PARKED_SUBJECT]
        try:
            await bus.js.update_stream(info.config)
        except NotFoundError:  # a concurrent migration finished first
            return None
        log.info("timers.legacy_parked", stream=legacy, subjects=LEGACY_PARKED_SUBJECT)
    # 2. the pending schedules, read once nothing can add one (they still fire, into the legacy stream: step 5)
    try:  # every page of them (a legacy stream of a busy deployment can hold more than 100,000 schedules)
        pending = await stream_subjects(bus.js, legacy, f"{TIMER_SCHEDULE_PREFIX}.>")
    except NotFoundError:  # a concurrent migration finished first
        return None
    schedules: list[tuple[str, bytes, dict[str, str], int]] = []
    for subject in pending:
        try:
            last = await bus.js.get_last_msg(legacy, subject)
        except NotFoundError:  # fired or expired meanwhile: its firing is taken in step 5
            continue
        if last.headers and "Nats-Schedule" in last.headers and last.seq is not None:
            schedules.append((subject, last.data or b"", _copied_headers(last.headers), last.seq))
    # 3. the new streams, created when missing; one that exists (a concurrent migration's, or its service's) is
    # left as it is: its owner applies its settings at its start, and no update runs while copies are stored
    missing = await bus.find_layout(targets, create_missing=True)
    if missing:
        raise TransientError(f"could not create {missing} (the server did not answer in time): run it again")
    held = {s for spec in targets for s in spec.subjects}
    copies: list[tuple[str, bytes, dict[str, str]]] = []
    skipped = 0
    for subject, payload, headers, seq in schedules:
        namespace = subject.removeprefix(f"{TIMER_SCHEDULE_PREFIX}.").split(".", 1)[0]
        if f"{TIMER_SCHEDULE_PREFIX}.{namespace}.>" not in held:
            log.warning("timers.legacy_skipped", subject=subject, why="no timers stream holds its namespace")
            skipped += 1
            continue
        copies.append((subject, payload, headers | {"Nats-Msg-Id": f"legacy-timers-{seq}"}))
    # 5. the firings no consumer has taken yet
    try:
        consumers = await bus.js.consumers_info(legacy)
        state = (await bus.js.stream_info(legacy)).state
    except NotFoundError:  # a concurrent migration finished first (it copied the same, guarded the same way)
        consumers, state = [], None
    if state is None:
        return None
    floor = min((c.ack_floor.stream_seq if c.ack_floor else 0 for c in consumers), default=state.last_seq)
    firings = 0
    for seq in range(max(floor + 1, state.first_seq), state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(legacy, seq)
        except NotFoundError:  # deleted (a purge, a rollup) or the whole stream (a concurrent migration)
            continue
        subject = msg.subject or ""
        if not subject.startswith(f"{TIMER_FIRED_PREFIX}."):
            continue
        readers = [c for c in consumers if _fired_by(c, subject)]
        if not any((c.ack_floor.stream_seq if c.ack_floor else 0) < seq for c in readers):
            skipped += not readers
            continue
        namespace, _ = parse_fired_subject(subject)
        if f"{TIMER_FIRED_PREFIX}.{namespace}.>" not in held:
            skipped += 1
            continue
        headers = _copied_headers(msg.headers)
        headers |= {
            "Nats-Schedule": f"@at {_rfc3339(datetime.now(UTC))}",
            "Nats-Schedule-Target": subject,
            "Nats-Msg-Id": f"legacy-timers-{seq}",
        }
        copies.append((f"{TIMER_SCHEDULE_PREFIX}.{namespace}.{LEGACY_FIRING_KEY}.{seq}", msg.data or b"", headers))
        firings += 1
    # 4 (and 5): every copy only onto a subject still empty in its new stream
    copied = 0
    for subject, payload, headers in copies:
        try:
            result = await bus.js.publish(
                subject, payload, headers=headers | {"Nats-Expected-Last-Subject-Sequence": "0"}
            )
        except BadRequestError as exc:  # the subject has a message: a newer arm or cancel, or a concurrent copy
            log.info("timers.legacy_kept_newer", subject=subject, error=str(exc))
            skipped += 1
            continue
        copied += not result.duplicate
    # 6. done: the legacy stream goes
    with contextlib.suppress(NotFoundError):  # a concurrent migration deleted it first
        await bus.js.delete_stream(legacy)
    report = LegacyMigration(schedules=len(copies) - firings, firings=firings, skipped=skipped)
    log.info("timers.legacy_migrated", stream=legacy, copied=copied, **dataclasses.asdict(report))
    return report
