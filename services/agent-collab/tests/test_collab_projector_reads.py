"""The saga projector's reads on a real nats-server: what it remembers saves reads, never a fact.

Most runs never collaborate, yet agent-collab projects each of their lifecycle events; the projector
remembers the saga ids it resolved (write-once) and the sagas it last wrote (the base of its next
compare-and-set), so one run's events take one read. Another projector's write in between (a second
replica) makes the remembered saga stale: its compare-and-set loses and the saga is read again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from temporality_agent_collab.hosted import HostedAgent, HostedAgents, hosted_key
from temporality_agent_collab.participants import RunIndex, SagaParticipants, saga_key
from temporality_agent_collab.projector import Projector
from temporality_bus import Bus, NatsSettings, Versioned, written_out
from temporality_protocol import (
    AgentSummary,
    Envelope,
    EventData,
    RunCompleted,
    RunStarted,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import BUCKET_AGENTS, BUCKET_COLLAB
from temporality_testing.facts import answered_by
from temporality_testing.kv_reads import kv_read_subjects


class Reads:
    """Counts the read requests of one KV bucket (direct gets and ``STREAM.MSG.GET``: ``kv_read_subjects``), seen by
    a connection of its own."""

    def __init__(self, nc: NATS, bucket: str = BUCKET_COLLAB.name) -> None:
        self._nc = nc
        self._bucket = bucket
        self.count = 0

    async def _seen(self, msg: Msg) -> None:
        self.count += 1

    async def start(self) -> None:
        for subject in kv_read_subjects(self._bucket):
            await self._nc.subscribe(subject, cb=self._seen)
        await written_out(self._nc)

    async def settled(self) -> int:
        """The count once every request made so far has reached this connection (the server forwards each
        request to it as it routes it; a flush's PONG comes after what was forwarded before its PING), taken
        when two flushes in a row saw no more."""
        while True:
            seen = self.count
            await self._nc.flush()
            await self._nc.flush()
            if self.count == seen:
                return seen


@pytest.fixture
async def reads(nats_settings: NatsSettings) -> AsyncIterator[Reads]:
    nc = await nats.connect(nats_settings.url)
    counter = Reads(nc)
    await counter.start()
    yield counter
    await nc.close()


@pytest.fixture
async def card_reads(nats_settings: NatsSettings) -> AsyncIterator[Reads]:
    nc = await nats.connect(nats_settings.url)
    counter = Reads(nc, BUCKET_AGENTS.name)
    await counter.start()
    yield counter
    await nc.close()


def _ev(data: EventData, run_id: str, correlation: str | None = None) -> Envelope:
    return make_event(data, source="/test", run_id=run_id, correlation_id=correlation)


def _lifecycle(run_id: str, agent: str, *, correlation: str | None = None) -> list[Envelope]:
    answered = answered_by("alice", run_id, derive_id("req", run_id))
    return [
        _ev(RunStarted(run_id=run_id, agent=agent, role="review", title="Review PR 7"), run_id, correlation),
        _ev(answered, run_id, correlation),
        _ev(RunCompleted(run_id=run_id, result="LGTM", turns=2), run_id, correlation),
    ]


async def _saga(bus: Bus, saga_id: str) -> SagaParticipants:
    store = await bus.store(BUCKET_COLLAB, SagaParticipants)
    found = await store.get(saga_key(saga_id))
    assert found is not None, f"saga {saga_id} not stored"
    return found.value


async def test_a_runs_lifecycle_takes_no_read(bus: Bus, reads: Reads) -> None:
    projector = await Projector.open(bus)
    run_id = derive_id("run", "reads-one")
    before = await reads.settled()
    for event in _lifecycle(run_id, "reviewer"):
        assert await projector.project(event)
    assert await reads.settled() == before  # index entry and saga created straight away, then remembered
    saga = await _saga(bus, run_id)
    assert saga.runs[run_id].status == "completed"
    assert set(saga.humans) == {"alice"}


async def test_a_run_started_after_its_saga_exists_reads_it_and_keeps_what_is_there(bus: Bus, reads: Reads) -> None:
    """The answer was projected first (another replica): the run's ``run.started`` finds its index entry and
    its saga there, its creations lose, it reads both and adds the run's start to what is stored."""
    a, b = await Projector.open(bus), await Projector.open(bus)
    run_id = derive_id("run", "reads-late-start")
    started, answered, completed = _lifecycle(run_id, "reviewer")
    assert await b.project(answered)
    before = await reads.settled()
    assert await a.project(started)
    assert await reads.settled() - before == 2  # the index entry, then the saga
    assert not await a.project(started)  # again (a redelivery): nothing changes
    assert await a.project(completed)
    saga = await _saga(bus, run_id)
    entry = saga.runs[run_id]
    assert (entry.agent, entry.role, entry.title, entry.status) == ("reviewer", "review", "Review PR 7", "completed")
    assert saga.humans["alice"].run_ids == [run_id]
    index = await (await bus.store(BUCKET_COLLAB, RunIndex)).get(f"run.{run_id}")
    assert index is not None
    assert index.value.saga_id == run_id


async def test_a_child_run_started_in_its_parents_saga_joins_it(bus: Bus) -> None:
    """A run of another run's saga is not created first: it is added to the saga that is there."""
    projector = await Projector.open(bus)
    parent, child = derive_id("run", "reads-join-parent"), derive_id("run", "reads-join-child")
    await projector.project(_lifecycle(parent, "planner")[0])
    await projector.project(_lifecycle(child, "reviewer", correlation=parent)[0])
    store = await bus.store(BUCKET_COLLAB, SagaParticipants)
    assert await store.get(saga_key(child)) is None
    assert set((await _saga(bus, parent)).runs) == {parent, child}


async def test_a_redelivered_event_is_read_again_and_changes_nothing(bus: Bus, reads: Reads) -> None:
    projector = await Projector.open(bus)
    run_id = derive_id("run", "reads-redelivered")
    events = _lifecycle(run_id, "reviewer")
    for event in events:
        await projector.project(event)
    before = await reads.settled()
    assert not await projector.project(events[1])  # "no change" is decided on what is stored: one read
    assert await reads.settled() - before == 1
    assert (await _saga(bus, run_id)).runs[run_id].status == "completed"


async def test_a_replica_that_did_not_see_the_run_start_reads_its_index_and_saga(bus: Bus, reads: Reads) -> None:
    a, b = await Projector.open(bus), await Projector.open(bus)
    run_id = derive_id("run", "reads-foreign")
    saga_id = derive_id("saga", "reads-foreign")
    started, answered, completed = _lifecycle(run_id, "reviewer", correlation=saga_id)
    await a.project(started)
    before = await reads.settled()
    assert await b.project(answered)
    assert await reads.settled() - before == 2  # the index entry, then the saga: as before remembering
    assert await b.project(completed)
    assert await reads.settled() - before == 2  # both remembered now
    assert (await _saga(bus, saga_id)).runs[run_id].status == "completed"


async def test_a_forgotten_run_is_looked_up_again_in_its_own_saga(bus: Bus) -> None:
    """With room for one run and one saga, each run's next event evicts the other's: nothing is lost."""
    projector = Projector(
        await bus.store(BUCKET_COLLAB, SagaParticipants),
        await bus.store(BUCKET_COLLAB, RunIndex),
        remembered=1,
        remembered_sagas=1,
    )
    first, second = derive_id("run", "evict-1"), derive_id("run", "evict-2")
    sagas = {first: derive_id("saga", "evict-1"), second: derive_id("saga", "evict-2")}
    lifecycles = {run: _lifecycle(run, "reviewer", correlation=sagas[run]) for run in (first, second)}
    for step in range(3):
        for run in (first, second):
            assert await projector.project(lifecycles[run][step])
    for run in (first, second):
        saga = await _saga(bus, sagas[run])
        assert {r: entry.status for r, entry in saga.runs.items()} == {run: "completed"}
        assert saga.humans["alice"].run_ids == [run]


async def test_another_replicas_write_in_between_is_kept(bus: Bus, reads: Reads) -> None:
    """Two projectors (replicas) on one saga: each remembers a saga the other has changed since."""
    a, b = await Projector.open(bus), await Projector.open(bus)
    parent, child = derive_id("run", "reads-parent"), derive_id("run", "reads-child")
    first, second = _lifecycle(parent, "planner"), _lifecycle(child, "reviewer", correlation=parent)
    await a.project(first[0])  # a remembers the saga with the parent only
    await b.project(second[0])  # b adds the child
    before = await reads.settled()
    assert await a.project(first[1])  # a's remembered saga is stale: its write loses, it reads, it writes
    assert await reads.settled() - before >= 1
    await b.project(second[2])
    await a.project(first[2])
    saga = await _saga(bus, parent)
    assert {run: entry.status for run, entry in saga.runs.items()} == {parent: "completed", child: "completed"}
    assert set(saga.humans) == {"alice"}


async def test_a_run_indexed_by_another_replica_keeps_that_saga(bus: Bus) -> None:
    """The index is first-writer-wins: a projector that did not write a run's entry reads it, whatever
    saga the event it is projecting proposes."""
    a, b = await Projector.open(bus), await Projector.open(bus)
    run_id = derive_id("run", "reads-indexed")
    saga_id = derive_id("saga", "reads-indexed")
    started, answered, _ = _lifecycle(run_id, "reviewer", correlation=saga_id)
    await a.project(started)
    stray = answered.model_copy(update={"correlationid": None})  # would propose the run itself as its saga
    assert await b.project(stray)
    assert (await _saga(bus, saga_id)).humans["alice"].run_ids == [run_id]
    store = await bus.store(BUCKET_COLLAB, SagaParticipants)
    assert await store.get(saga_key(run_id)) is None  # no saga of its own was started for the run


def _started(n: int, *, model: str | None = None, seconds: int | None = None, agent: str = "reviewer") -> Envelope:
    """The ``n``-th run of ``agent`` (model ``model-<n>`` unless ``model``), started ``n`` minutes after the first
    (``seconds`` seconds, if given)."""
    run_id = derive_id("run", f"card-{agent}-{n}")
    card = AgentSummary(
        provider="openai", model=model or f"model-{n}", tools=["ask_human"], max_turns=8, max_compute_s=60
    )
    data = RunStarted(run_id=run_id, agent=agent, role="review", title="Review", agent_card=card)
    at = datetime(2026, 12, 6, 4, n, tzinfo=UTC) if seconds is None else datetime(2026, 12, 6, 4, tzinfo=UTC)
    return make_event(data, source="/test", run_id=run_id, time=at + timedelta(seconds=seconds or 0))


async def _card(bus: Bus, agent: str) -> Versioned[HostedAgent]:
    store = await bus.store(BUCKET_AGENTS, HostedAgent)
    stored = await store.get(hosted_key(agent))
    assert stored is not None, f"no card of {agent}"
    return stored


async def test_a_hosted_agents_next_run_writes_its_card_without_a_read(bus: Bus, card_reads: Reads) -> None:
    a, b = await HostedAgents.open(bus), await HostedAgents.open(bus)
    first, second, third, fourth = (_started(n) for n in range(4))
    assert await a.on_run_event(first)  # new: read (nothing there), created
    before = await card_reads.settled()
    assert await a.on_run_event(second)  # from what a wrote: no read
    assert await card_reads.settled() == before
    assert await b.on_run_event(third)  # b knows nothing yet: one read
    assert await a.on_run_event(fourth)  # a's card is stale since b wrote: its write loses, it reads
    assert await card_reads.settled() - before >= 2
    stored = await _card(bus, "reviewer")
    assert (stored.value.last_run_id, stored.value.summary.model) == (derive_id("run", "card-reviewer-3"), "model-3")


async def test_a_run_that_changes_nothing_but_its_id_does_not_rewrite_the_card(bus: Bus, card_reads: Reads) -> None:
    """Within the refresh interval a run with the card's role and summary neither reads nor writes it; a changed
    summary, or a run started the interval after the card's, writes it; an older run never does."""
    a = await HostedAgents.open(bus, refresh_s=60)
    agent = "steady"

    async def projected(hosted: HostedAgents, event: Envelope) -> tuple[bool, int]:
        """Whether ``hosted`` changed the card, and how many reads of the bucket that took."""
        before = await card_reads.settled()
        changed = await hosted.on_run_event(event)
        return changed, await card_reads.settled() - before

    assert await a.on_run_event(_started(0, model="m", seconds=0, agent=agent))
    first = await _card(bus, agent)
    assert await projected(a, _started(1, model="m", seconds=30, agent=agent)) == (False, 0)  # nothing new
    assert await projected(a, _started(2, model="m", seconds=59, agent=agent)) == (False, 0)
    assert await _card(bus, agent) == first  # not written: the first run's card, same revision
    assert await projected(a, _started(3, model="m2", seconds=59, agent=agent)) == (True, 0)  # changed: at once
    assert (await _card(bus, agent)).value.last_run_id == derive_id("run", f"card-{agent}-3")
    assert await projected(a, _started(4, model="m2", seconds=100, agent=agent)) == (False, 0)  # 41 s after it
    assert await projected(a, _started(5, model="m2", seconds=119, agent=agent)) == (True, 0)  # 60 s: refreshed
    assert await projected(a, _started(6, model="m", seconds=110, agent=agent)) == (False, 0)  # older: never
    stored = await _card(bus, agent)
    assert (stored.value.last_run_id, stored.value.summary.model) == (derive_id("run", f"card-{agent}-5"), "m2")
    assert stored.value.last_started_at == datetime(2026, 12, 6, 4, 1, 59, tzinfo=UTC)

    b = await HostedAgents.open(bus, refresh_s=60)  # a replica that knows nothing: one read, no write
    assert await projected(b, _started(7, model="m2", seconds=130, agent=agent)) == (False, 1)
    assert await projected(b, _started(8, model="m2", seconds=140, agent=agent)) == (False, 0)  # now it knows
    assert await _card(bus, agent) == stored


async def test_without_a_refresh_interval_every_run_writes_the_card(bus: Bus) -> None:
    hosted = await HostedAgents.open(bus, refresh_s=0)
    agent = "every-run"
    for n in range(3):
        assert await hosted.on_run_event(_started(n, model="m", seconds=n, agent=agent))
        assert (await _card(bus, agent)).value.last_run_id == derive_id("run", f"card-{agent}-{n}")
    assert not await hosted.on_run_event(_started(0, model="m", seconds=0, agent=agent))  # an older one: never
    assert (await _card(bus, agent)).value.last_run_id == derive_id("run", f"card-{agent}-2")
