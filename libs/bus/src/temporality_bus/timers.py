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

import re
from datetime import UTC, datetime, timedelta

from temporality_bus.connection import Bus, PublishResult
from temporality_bus.consumer import Delivery, RawHandler
from temporality_bus.errors import TransientError
from temporality_bus.provenance import ForgedEvent, SourceCheck, forged_firing
from temporality_bus.tracing import TimerTrace, timer_headers
from temporality_protocol.catalog import TIMER_FIRED_PREFIX, TIMER_SCHEDULE_PREFIX, TIMERS_STREAM, StreamSpec

__all__ = ["CANCEL_TTL_S", "Timers", "checking_firings", "fire_time", "parse_fired_subject", "schedule_at"]

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
    headers = timer_headers(trace)
    headers |= {"Nats-Schedule": f"@at {_rfc3339(at)}", "Nats-Schedule-Target": target_subject}
    if msg_id is not None:
        headers["Nats-Msg-Id"] = msg_id
    return await bus.publish_raw(schedule_subject, payload, headers)


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
        self, bus: Bus, namespace: str, *, stream: StreamSpec = TIMERS_STREAM, trace: TimerTrace = "continue"
    ) -> None:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"timer namespace {namespace!r} must be one subject token ([A-Za-z0-9_=-]+)")
        self._bus = bus
        self.namespace = namespace
        self.stream = stream.name
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
        return await schedule_at(
            self._bus,
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
        subject = self.schedule_subject(key)
        headers = {"Nats-Rollup": "sub", "Nats-TTL": f"{CANCEL_TTL_S}s"}
        try:
            await self._bus.publish_raw(subject, b"", headers)
        except TransientError as exc:
            raise TransientError(f"cancelling timer {subject} failed: {exc}") from exc
