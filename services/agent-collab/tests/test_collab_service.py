"""agent-collab against a real nats-server: projector through a real Consumer, get_collaborators over request/reply."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import pytest

from temporality_agent_collab.__main__ import SPEC, configure
from temporality_agent_collab.participants import SagaParticipants, saga_key
from temporality_agent_collab.settings import Settings
from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    Collaborator,
    CollaboratorsQuery,
    CollaboratorsReply,
    Envelope,
    EventData,
    RunCompleted,
    RunFailed,
    RunStarted,
    decode,
    derive_id,
    encode,
    make_event,
)
from temporality_protocol.catalog import BUCKET_COLLAB, CONSUMERS, DLQ_STREAM, EVENTS_STREAM, RPC_GET_COLLABORATORS
from temporality_service import run_until
from temporality_testing.facts import answered_by

CONSUMER = CONSUMERS["agent-collab-runs"]
PARENT = derive_id("run", "svc-parent")
CHILD = derive_id("run", "svc-child")


# --------------------------------------------------------------------------- helpers
def _ev(data: EventData, run_id: str, correlation: str | None = None) -> Envelope:
    return make_event(data, source="/test", run_id=run_id, correlation_id=correlation)


def _saga_events() -> list[Envelope]:
    return [
        _ev(RunStarted(run_id=PARENT, agent="planner", role="lead", title="Plan the release"), PARENT),
        _ev(
            RunStarted(run_id=CHILD, agent="reviewer", role="review", title="Review PR 42", parent_run_id=PARENT),
            CHILD,
            PARENT,
        ),
        _ev(
            answered_by("alice", CHILD, "req-1", waited_s=12.5),
            CHILD,
            PARENT,
        ),
    ]


async def _publish(bus: Bus, events: list[Envelope]) -> int:
    last = 0
    for event in events:
        last = (await bus.publish(event)).seq
    return last


async def _settled(bus: Bus, seq: int, within_s: float = 30.0) -> None:
    """Wait until the agent-collab consumer has acked everything up to stream sequence ``seq``."""
    deadline = time.monotonic() + within_s
    while True:
        info = await bus.js.consumer_info(EVENTS_STREAM.name, CONSUMER.durable)
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"consumer not settled at {seq}: {info}")
        await asyncio.sleep(0.05)


def _query(run_id: str, versions: list[str] | None = None) -> bytes:
    q = (
        CollaboratorsQuery(run_id=run_id)
        if versions is None
        else CollaboratorsQuery(run_id=run_id, protocol_versions=versions)
    )
    return q.model_dump_json().encode()


async def _ask(bus: Bus, body: bytes) -> CollaboratorsReply:
    """One get_collaborators request.

    A request sent right after another connection's SUB + ``flush()`` occasionally (~0.5 %) got "no
    responders": nats-py's flush writes its PING ahead of the buffered SUB, so its PONG did not mean the
    server had the subscription. The responder now waits with ``temporality_bus.written_out`` (two flushes)
    before it reports running; a requester still treats "no responders" as transient, as any client should.
    """
    for _ in range(3):
        try:
            raw = await bus.request(RPC_GET_COLLABORATORS, body, timeout_s=15)
        except nats.errors.NoRespondersError:
            await bus.nc.flush()
            continue
        return CollaboratorsReply.model_validate_json(raw)
    raise AssertionError("no agent-collab responder")


EXPECTED = [
    Collaborator(
        id="agent:planner", kind="agent", role="lead", task="Plan the release", status="running", run_id=PARENT
    ),
    Collaborator(id="agent:reviewer", kind="agent", role="review", task="Review PR 42", status="running", run_id=CHILD),
    Collaborator(id="human:alice", kind="human", status="answered", run_id=CHILD),
]


# --------------------------------------------------------------------------- fixtures
@dataclass
class Replica:
    """One in-process agent-collab replica on its own connection."""

    stop: asyncio.Event
    task: asyncio.Task[None]

    async def stopped(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)


StartReplica = Callable[[], Awaitable[Replica]]


@pytest.fixture
async def replicas(nats_settings: NatsSettings) -> AsyncIterator[StartReplica]:
    """Start agent-collab replicas (``serve``) in-process; all are stopped at teardown."""
    running: list[Replica] = []

    async def _replica(stop: asyncio.Event, ready: asyncio.Event) -> None:
        settings = Settings(nats=nats_settings)
        await run_until(SPEC, settings, configure(settings), stop, ready=ready)

    async def start() -> Replica:
        stop, ready = asyncio.Event(), asyncio.Event()
        replica = Replica(stop, asyncio.create_task(_replica(stop, ready)))
        running.append(replica)
        ready_wait = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait([replica.task, ready_wait], timeout=10, return_when="FIRST_COMPLETED")
        ready_wait.cancel()
        if replica.task in done:
            replica.task.result()  # re-raise why it died
        assert ready.is_set(), "agent-collab replica not ready within 10 s"
        return replica

    yield start
    for replica in running:
        replica.stop.set()
    for replica in running:
        await asyncio.wait_for(replica.task, 15)


@pytest.fixture
async def collab(replicas: StartReplica) -> Replica:
    return await replicas()


# --------------------------------------------------------------------------- tests
async def test_get_collaborators_lists_the_sagas_agents_and_humans(bus: Bus, collab: Replica) -> None:
    await _settled(bus, await _publish(bus, _saga_events()))
    for run_id in (PARENT, CHILD):  # a query by any run of the saga finds the saga
        reply = await _ask(bus, _query(run_id))
        assert reply.error is None
        assert reply.run_id == run_id
        assert reply.saga_id == PARENT
        assert reply.protocol_version == "1.0"
        assert reply.collaborators == EXPECTED


async def test_redelivered_and_duplicated_events_change_nothing(bus: Bus, collab: Replica) -> None:
    events = _saga_events()
    await _publish(bus, events)
    # JetStream dedupes the same Nats-Msg-Id ...
    assert all([(await bus.publish(e)).duplicate for e in events])
    # ... so bypass it: the same CloudEvents again under new message ids reach the projector
    last = 0
    for n, event in enumerate(events):
        last = (await bus.publish_raw(event.nats_subject, encode(event), {"Nats-Msg-Id": f"dup-{n}"})).seq
    await _settled(bus, last)
    info = await bus.js.consumer_info(EVENTS_STREAM.name, CONSUMER.durable)
    assert info.delivered.stream_seq >= last

    reply = await _ask(bus, _query(PARENT))
    assert reply.collaborators == EXPECTED
    stored = await (await bus.store(BUCKET_COLLAB, SagaParticipants)).get(saga_key(PARENT))
    assert stored is not None
    assert sorted(stored.value.applied_event_ids) == sorted(e.id for e in events)
    assert stored.value.humans["alice"].run_ids == [CHILD]


async def test_status_follows_completed_and_failed(bus: Bus, collab: Replica) -> None:
    await _publish(bus, _saga_events())
    last = await _publish(
        bus,
        [
            _ev(RunCompleted(run_id=CHILD, result="LGTM", turns=4), CHILD, PARENT),
            _ev(RunFailed(run_id=PARENT, reason="budget", error="too many turns"), PARENT),
        ],
    )
    await _settled(bus, last)
    reply = await _ask(bus, _query(CHILD))
    assert {c.id: c.status for c in reply.collaborators} == {
        "agent:planner": "failed",
        "agent:reviewer": "completed",
        "human:alice": "answered",
    }


async def test_events_before_run_started_still_create_the_run(bus: Bus, collab: Replica) -> None:
    orphan = derive_id("run", "orphan")
    await _settled(bus, await _publish(bus, [_ev(RunCompleted(run_id=orphan, result="x", turns=1), orphan)]))
    reply = await _ask(bus, _query(orphan))
    assert reply.collaborators == [Collaborator(id=f"run:{orphan}", kind="run", status="completed", run_id=orphan)]


async def test_concurrent_updates_of_one_saga_all_land(bus: Bus, collab: Replica) -> None:
    answers = [
        _ev(
            answered_by(f"u{n:02d}", PARENT, f"req-{n}", "ok"),
            PARENT,
        )
        for n in range(30)
    ]
    await _settled(bus, await _publish(bus, answers))
    reply = await _ask(bus, _query(PARENT))
    assert [c.id for c in reply.collaborators] == [f"run:{PARENT}"] + [f"human:u{n:02d}" for n in range(30)]


async def test_no_common_protocol_version_is_refused_explicitly(bus: Bus, collab: Replica) -> None:
    await _settled(bus, await _publish(bus, _saga_events()))
    reply = await _ask(bus, _query(PARENT, ["2.0", "3.1"]))
    assert reply.run_id == PARENT
    assert reply.collaborators == []
    assert reply.error is not None
    assert "no common protocol version" in reply.error
    assert "2.0" in reply.error
    # the highest common version is chosen; unknown fields and unparseable versions are ignored
    body = b'{"run_id": "%s", "protocol_versions": ["2.0", "1.0", "next"], "future_field": 1}' % PARENT.encode()
    reply = await _ask(bus, body)
    assert reply.error is None
    assert reply.protocol_version == "1.0"
    assert reply.collaborators == EXPECTED


@pytest.mark.parametrize(
    ("body", "run_id"),
    [
        (b"not json", ""),
        (b"", ""),
        (b"[1, 2]", ""),
        (b'{"protocol_versions": ["1.0"]}', ""),
        (b'{"run_id": 42}', ""),
        (b'{"run_id": "run-1", "protocol_versions": "1.0"}', "run-1"),
    ],
)
async def test_a_malformed_request_gets_an_error_reply(bus: Bus, collab: Replica, body: bytes, run_id: str) -> None:
    reply = await _ask(bus, body)
    assert reply.error is not None
    assert reply.error.startswith("malformed request")
    assert reply.run_id == run_id
    # and the responder is still there
    assert (await _ask(bus, _query("run-unknown"))).error is not None


@pytest.mark.parametrize("run_id", [derive_id("run", "nobody"), "not a key!", ""])
async def test_an_unknown_run_gets_an_error_reply(bus: Bus, collab: Replica, run_id: str) -> None:
    reply = await _ask(bus, _query(run_id))
    assert reply.error is not None
    assert reply.error.startswith("unknown run")
    assert reply.collaborators == []


async def test_an_event_whose_run_cannot_be_a_key_is_dead_lettered(bus: Bus, collab: Replica) -> None:
    bad = _ev(RunFailed(run_id="bad run id", reason="r", error="e"), "bad run id")
    await bus.publish(bad)
    dlq = await bus.js.pull_subscribe(f"temporality.dlq.{CONSUMER.durable}", durable="t-dlq", stream=DLQ_STREAM.name)
    (msg,) = await dlq.fetch(1, timeout=30)  # the dead letter is written by the replica's consumer
    assert decode(msg.data).id == bad.id
    assert msg.headers is not None
    assert "KV key" in msg.headers["Temporality-Error"]
    # the consumer goes on
    await _settled(bus, await _publish(bus, _saga_events()))
    assert (await _ask(bus, _query(PARENT))).collaborators == EXPECTED


async def test_replicas_share_the_subject_in_one_queue_group(bus: Bus, replicas: StartReplica) -> None:
    first, second = await replicas(), await replicas()
    await _settled(bus, await _publish(bus, _saga_events()))
    inbox = bus.nc.new_inbox()
    replies = await bus.nc.subscribe(inbox)
    n = 20
    for k in range(n):
        await bus.nc.publish(RPC_GET_COLLABORATORS, _query(f"run-{k}"), reply=inbox)
    await bus.nc.flush()
    # stopping drains each responder: requests already received are answered before it goes
    await first.stopped()
    await second.stopped()
    got: list[str] = []
    async with asyncio.timeout(30):  # every reply reaches us (not just the ones here after one round trip)
        while len(got) < n:
            got.append(CollaboratorsReply.model_validate_json((await replies.next_msg(timeout=30)).data).run_id)
    try:  # a settle window: no request is answered a second time
        extra = await replies.next_msg(timeout=1)
    except nats.errors.TimeoutError:
        pass
    else:
        got.append(CollaboratorsReply.model_validate_json(extra.data).run_id)
    assert sorted(got) == sorted(f"run-{k}" for k in range(n))  # each request answered exactly once


async def test_a_stopping_replica_hands_over_to_the_others(bus: Bus, replicas: StartReplica) -> None:
    first = await replicas()
    await replicas()
    await _settled(bus, await _publish(bus, _saga_events()))
    await first.stopped()  # unsubscribes its responder first; the other replica keeps answering
    for _ in range(5):
        assert (await _ask(bus, _query(PARENT))).collaborators == EXPECTED


async def test_the_process_serves_marks_ready_and_drains_on_sigterm(
    bus: Bus, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_settings.url,
        "TEMPORALITY_NATS_DRAIN_TIMEOUT_S": "2",
        "TEMPORALITY_READY_FILE": str(ready),
        "TEMPORALITY_LOG_FORMAT": "console",
    }
    log_path = tmp_path / "agent-collab.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_agent_collab", env=env, stdout=log_file, stderr=log_file
        )
        try:
            deadline = time.monotonic() + 60  # a process start on the shared, loaded machine
            while not ready.exists():  # the ready file is the readiness signal
                assert proc.returncode is None, log_path.read_text()
                assert time.monotonic() < deadline, f"not ready: {log_path.read_text()}"
                await asyncio.sleep(0.05)
            assert ready.read_text().strip() == str(proc.pid)
            await _settled(bus, await _publish(bus, _saga_events()))
            assert (await _ask(bus, _query(CHILD))).collaborators == EXPECTED

            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0, log_path.read_text()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    logs = log_path.read_text()
    assert logs.index("collab.responder_stopped") < logs.index("consumer.stopped")
