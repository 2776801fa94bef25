"""What the run-executor's events say caused them (the envelope's ``causationid``), as the tests check it.

:class:`Wire` sees every copy of every event published on the bus -- a core NATS subscription on the events'
subjects, so it gets the copies JetStream drops as duplicates too, which a journal reader never sees: a redelivery
or a recovery that republished an event with another causation shows there (:meth:`Wire.same_causation`).
:func:`assert_caused` holds a run's journal to the rule: every event the executor published names as its cause an
event of the same run stored before it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from temporality_protocol import Envelope, InvalidEnvelope, decode
from temporality_protocol.catalog import EVENTS_PREFIX
from temporality_run_executor.engine import SOURCE


class Wire:
    """Every copy of each event published on ``temporality.events.>`` from :meth:`start` on: id -> causations."""

    def __init__(self) -> None:
        self.copies: dict[str, list[str | None]] = defaultdict(list)
        self.types: dict[str, str] = {}

    async def start(self, nc: NATS) -> Wire:
        async def on_msg(msg: Msg) -> None:
            try:
                event = decode(msg.data)
            except InvalidEnvelope:
                return
            self.copies[event.id].append(event.causationid)
            self.types[event.id] = event.type

        await nc.subscribe(f"{EVENTS_PREFIX}.>", cb=on_msg)
        await nc.flush()
        return self

    def same_causation(self) -> list[str]:
        """The events published more than once with different causations (``[]``: none)."""
        return [
            f"{self.types[event_id]} {event_id}: {causes}"
            for event_id, causes in self.copies.items()
            if len(set(causes)) > 1
        ]


def of_run(event: Envelope, run_id: str) -> bool:
    return event.runid == run_id or event.data.get("run_id") == run_id


def assert_caused(events: Sequence[Envelope], run_id: str) -> dict[str, Envelope]:
    """Every event of ``run_id`` the executor published (in journal order) is caused by one of the run's events
    stored before it; returns the run's events by id."""
    seen: dict[str, Envelope] = {}
    for event in events:
        if not of_run(event, run_id):
            continue
        if event.source == SOURCE:
            cause = event.causationid
            assert cause in seen, (
                f"{event.type} {event.id} is caused by {cause!r}, not by an earlier event of run {run_id}: "
                f"{[(e.type, e.id) for e in seen.values()]}"
            )
        seen[event.id] = event
    return seen
