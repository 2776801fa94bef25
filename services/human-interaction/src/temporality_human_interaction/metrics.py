"""human-interaction's own metrics, on the process's registry (``/metrics``, next to the runtime's).

=================================================  ==================================================
``temporality_human_deliveries_total``             counter by ``channel``, ``send`` (``question``,
                                                   ``reminder``, ``escalation``) and ``outcome``
                                                   (``delivered``; ``failed``: the transport refused or
                                                   erred; ``unavailable``: the adapter is down). One per
                                                   attempt on a channel, counted in the adapter
                                                   (:meth:`.channels.ChannelAdapter.deliver`): a
                                                   fallback after a failure is a second attempt. A
                                                   channel the person has no identity on is not tried,
                                                   so not counted; nor are notifications (the web
                                                   inbox refuses every one by design)
``temporality_human_channel_available``            gauge by ``channel``: 1 while this replica's adapter
                                                   can deliver (Matrix logged in and syncing, ...)
``temporality_human_wait_seconds``                 histogram by ``outcome`` (``answered``, ``expired``,
                                                   ``cancelled``): how long a request waited, from the
                                                   question to its end, observed once per request by
                                                   the replica whose compare-and-set ended it (a
                                                   redelivery or a repeated answer observes nothing)
``temporality_human_requests_waiting``             gauge: requests pending now (waiting for a person)
``temporality_human_requests_overdue``             gauge: pending requests past their deadline (the
                                                   deadline timer should have ended them: a lost timer
                                                   or a stuck ``human-interaction-deadlines`` consumer)
``temporality_human_requests_overdue_seconds``     gauge: how long past its deadline the most overdue
                                                   pending request is (0: none)
=================================================  ==================================================

The three request gauges are whole-system numbers counted from the run entries of ``human-channels`` whose
request has not ended (``run.<run>.<id>``, from the replica's mirror of the bucket once caught up, else one
listing; each entry carries its request's deadline, so a record is read only for a request past its deadline,
:func:`count_open`; read-only: the index repair is the start's, the sweep's and the inbox's)
every ``STATE_REFRESH_S`` seconds by every replica:
aggregate them with ``max()``, never ``sum()``. The counters and the histogram are per replica: ``sum()``.
The channel gauge is per replica: a channel down on one replica fails that replica's deliveries.

A compare-and-set whose reply is lost (it committed, the caller saw an error) is not observed: the retry
finds the request already ended. The wait histogram may miss such a request, never count one twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol, get_args

from temporality_bus import Bus, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS
from temporality_human_interaction.mirror import ChannelMirror, to_channel_entry
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, open_store
from temporality_protocol import HumanRequestState
from temporality_service import ServiceMetrics

__all__ = [
    "WAIT_BUCKETS",
    "DeliveryObserver",
    "DeliveryOutcome",
    "HumanMetrics",
    "OpenCounts",
    "RequestObserver",
    "count_open",
    "send_of",
]

DeliveryOutcome = Literal["delivered", "failed", "unavailable"]

#: Seconds: from a quick answer to a week-long wait (the longest timeout a trigger allows).
WAIT_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0)

_ENDED = {
    HumanRequestState.ANSWERED: "answered",
    HumanRequestState.EXPIRED: "expired",
    HumanRequestState.CANCELLED: "cancelled",
}


#: The ``send`` label's values (:func:`send_of`).
SENDS = ("question", "reminder", "escalation")


def send_of(tag: str) -> str:
    """The ``send`` label of a delivery's tag (:attr:`.records.SentCopy.tag`)."""
    if tag == "":
        return "question"
    return "reminder" if tag.startswith("reask-") else tag


class DeliveryObserver(Protocol):
    """What a channel adapter reports each delivery attempt to."""

    def delivery(self, channel: str, tag: str, outcome: DeliveryOutcome) -> None: ...


class RequestObserver(Protocol):
    """What the code that ends a request (its compare-and-set) reports the ended request to."""

    def ended(self, record: HumanRequestRecord) -> None: ...


class HumanMetrics:
    """human-interaction's instruments on the process's :class:`~temporality_service.ServiceMetrics`."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._service = metrics.service
        self._deliveries = metrics.counter(
            "temporality_human_deliveries",
            "Delivery attempts of a question (or a reminder, an escalation) on a channel, by outcome",
            ["channel", "send", "outcome"],
        )
        self._available = metrics.gauge(
            "temporality_human_channel_available", "1 while this replica's channel adapter can deliver", ["channel"]
        )
        self._wait = metrics.histogram(
            "temporality_human_wait_seconds",
            "How long a request waited for a person, from the question to its end, by outcome",
            ["outcome"],
            buckets=WAIT_BUCKETS,
        )
        self._waiting = metrics.gauge("temporality_human_requests_waiting", "Requests waiting for a person (pending)")
        self._overdue = metrics.gauge(
            "temporality_human_requests_overdue", "Pending requests past their deadline (should have expired)"
        )
        self._overdue_s = metrics.gauge(
            "temporality_human_requests_overdue_seconds", "How long past its deadline the most overdue request is"
        )

    # ------------------------------------------------------------------ per replica
    def delivery(self, channel: str, tag: str, outcome: DeliveryOutcome) -> None:
        self._deliveries.labels(self._service, channel, send_of(tag), outcome).inc()

    def watch_channels(self, adapters: Mapping[str, _Available]) -> None:
        """Report each adapter's availability at every scrape, and make each channel's delivery series at 0: the
        alert on a failing channel reads ``increase()``, which sees no rise in a series first scraped at 1."""
        for name, adapter in adapters.items():
            self._available.labels(self._service, name).set_function(_availability(adapter))
            for send in SENDS:
                for outcome in get_args(DeliveryOutcome):
                    self._deliveries.labels(self._service, name, send, outcome)

    def ended(self, record: HumanRequestRecord) -> None:
        outcome = _ENDED.get(record.status)
        if outcome is None:
            return
        self._wait.labels(self._service, outcome).observe(record.waited_s(record.ended_at or datetime.now(UTC)))

    # ------------------------------------------------------------------ whole system (max() across replicas)
    async def refresh(self, bus: Bus, mirror: ChannelMirror | None = None) -> None:
        """Count the pending requests (and those past their deadline) from the run entries (``mirror``'s)."""
        counts = await count_open(bus, datetime.now(UTC), mirror)
        self._waiting.labels(self._service).set(counts.waiting)
        self._overdue.labels(self._service).set(counts.overdue)
        self._overdue_s.labels(self._service).set(round(counts.worst_s, 3))


@dataclass(frozen=True)
class OpenCounts:
    waiting: int
    overdue: int
    #: How long past its deadline the most overdue pending request is (0: none).
    worst_s: float
    #: How many request records the count had to read (the overdue ones, and old entries without a deadline).
    read: int


async def count_open(bus: Bus, now: datetime, mirror: ChannelMirror | None = None) -> OpenCounts:
    """The run entries (``run.<run>.<id>``) not marked ended: each counts as waiting, by the deadline it carries --
    from ``mirror`` once it has applied the bucket's last revision, else one listing of ``run.>``. Only a request
    past its deadline is read (it should have expired: is it still pending?), and one whose entry has no deadline
    (an older version wrote it).

    Read-only: every replica refreshes the gauges, so nothing here writes. A stale entry (its request ended,
    the mark was lost) counts as waiting until its deadline, then is read and not counted; the inbox, the
    retention sweep and the next start mark it, and date an older version's entries
    (:func:`.inbox.rebuild_index`, :meth:`.inbox.RetentionSweeper.sweep`)."""
    if mirror is not None and await mirror.caught_up():
        entries = mirror.pending_runs()  # (kept by the mirror: no sort of every key at each refresh)
    else:
        kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
        entries = [found for entry in await live_entries(kv, "run.>") if (found := to_channel_entry(entry))]
    deadlines: dict[str, datetime | None] = {}
    for entry in entries:
        if entry.ended_at is None:
            deadlines[entry.value] = entry.expires_at
    store: RequestStore | None = None
    waiting = overdue = read = 0
    worst = 0.0
    for request_id, expires_at in deadlines.items():
        if expires_at is not None and expires_at > now:
            waiting += 1  # before its deadline: counted from the index alone
            continue
        store = store or await open_store(bus)
        got = await store.get(request_id)
        read += 1
        if got is None or not got.value.pending:  # never stored, or a lost removal: not waiting
            continue
        record = got.value
        waiting += 1
        late = (now - record.expires_at).total_seconds()
        if late > 0:
            overdue += 1
            worst = max(worst, late)
    return OpenCounts(waiting, overdue, worst, read)


class _Available(Protocol):
    @property
    def available(self) -> bool: ...


def _availability(adapter: _Available) -> Callable[[], float]:
    return lambda: 1.0 if adapter.available else 0.0
