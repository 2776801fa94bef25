"""agent-collab's start-up announcement of external agents' actions, and refused handoffs, with agent-collab and the
run-executor as processes on a real nats-server (issue 10, AP-5, AP-6, AP-8); the test is the external agent,
speaking the signed Agent Protocol (register, poll, act).

- agent-collab killed at the test seam between committing an agent's action and publishing ``agent.task.acted``
  (``tests/collab_crash_harness.py``: ``os._exit(137)`` at ``act:committed``), the agent never sending the action
  again: the next agent-collab announces it at its start and the parked run wakes then, once.
- At a restart agent-collab announces only what is truly un-announced: actions a run has taken up (a later turn
  offered, the run finished) are not published again even when their records carry no announcement mark (records
  from before ``acted_announced``), and a second restart announces nothing at all. Every publish is seen on core
  NATS, so a republish JetStream would drop as a duplicate is still counted.
- A handoff agent-collab refuses (not granted, no document, the wrong turn) gets a typed refusal and no child run
  id, and the very same handoff sent again gets the very same answer; the refusals change nothing.

The module shares one stack (its start is most of the cost); each test waits only on its own runs' events.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import yaml
from collab_crash_harness import CRASH_AT_ENV, CRASH_EXIT_STATUS
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import eventually
from signed_agent_support import SignedAgent

from temporality_agent_collab.signing import public_key_text
from temporality_agent_collab.tasks import acted
from temporality_bus import Bus, NatsSettings, Store, evolve
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.processes import ServiceProcess
from temporality_protocol import (
    CollaboratorsQuery,
    CollaboratorsReply,
    HumanPolicy,
    LaunchSource,
    RunRequested,
    RunState,
    TaskAction,
    decode,
    make_event,
)
from temporality_protocol.agent_tasks import TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_AGENT_TASKS,
    BUCKET_RUNS,
    RPC_GET_COLLABORATORS,
    subject_for,
)
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

AGENT = "announce-bot"
KEY = Ed25519PrivateKey.generate()
SESSION = "announce-session-1"
GRANTED = ["get_input", "ask_human"]
#: A process start, a redelivery or a timer, on the shared and loaded machine.
WAIT_S = 60.0
HARNESS = Path(__file__).resolve().parent / "collab_crash_harness.py"


class CrashingCollab(ServiceProcess):
    """agent-collab run by the crash harness: the same service, dying at its seam's point."""

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(HARNESS)]


@dataclass
class Stack:
    nats: NatsServer
    root: Path
    env: dict[str, str]
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    starts: int = 0

    def start(self, name: str, *, crash_at: str | None = None) -> ServiceProcess:
        self.starts += 1
        run_dir = self.root / f"run-{self.starts}"
        if crash_at is None:
            process = ServiceProcess(name, self.env, run_dir)
        else:
            assert name == "agent-collab"
            process = CrashingCollab(name, {**self.env, CRASH_AT_ENV: crash_at}, run_dir)
        process.start()
        process.wait_ready(WAIT_S)
        self.services[name] = process
        return process

    def restart_collab(self, *, crash_at: str | None = None) -> ServiceProcess:
        """agent-collab stopped (SIGTERM, drained) and started again."""
        assert self.services["agent-collab"].terminate() == 0
        return self.start("agent-collab", crash_at=crash_at)


def _files(root: Path) -> dict[str, str]:
    allow = root / "external-agents.yaml"
    allow.write_text(
        yaml.safe_dump(
            {
                "heartbeat_interval_s": 600,  # never offline while the module runs
                "agents": [{"id": AGENT, "allowed_tools": GRANTED, "public_key": public_key_text(KEY.public_key())}],
            }
        ),
        encoding="utf-8",
    )
    card = {
        "id": "ext-announced",
        "role": "Triage (external agent)",
        "system_prompt": "Decide.",
        "tools": {"allow": GRANTED},
        "provider": {"kind": "external", "agent_id": AGENT},
        "limits": {"max_turns": 5, "max_compute_s": 600},  # far beyond the test: only an announcement wakes a run
    }
    cards = root / "agents.yaml"
    cards.write_text(yaml.safe_dump({"agents": [card]}), encoding="utf-8")
    return {
        "TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE": str(allow),
        "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(cards),
    }


async def _prepare(url: str) -> None:
    """The streams and buckets (the journal owns them in a deployment; no journal runs here)."""
    async with Bus.connect(NatsSettings(url=url), name="test-setup") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("collab-announce")
    nats_server = NatsServer(root / "nats")
    nats_server.start()
    env = {
        "TEMPORALITY_NATS_URL": nats_server.url,
        "TEMPORALITY_NATS_ACK_WAIT_S": "2",
        "TEMPORALITY_LOG_FORMAT": "console",
        **_files(root),
    }
    stack = Stack(nats_server, root, env)
    try:
        asyncio.run(_prepare(nats_server.url))
        stack.start("agent-collab")  # first: it creates the tasks' bucket the executor reads
        stack.start("run-executor")
        yield stack
    finally:
        for process in stack.services.values():
            process.terminate()
        nats_server.stop()


@dataclass
class Published:
    """Every ``agent.task.*`` publish on core NATS -- a republish JetStream drops as a duplicate included."""

    messages: list[tuple[str, str, str | None]] = field(default_factory=list)

    def of(self, event_type: str, run_id: str) -> list[str]:
        """The event ids published for the run, in order (duplicates kept)."""
        return [event_id for t, event_id, runid in self.messages if t == event_type and runid == run_id]


@dataclass
class Client:
    bus: Bus
    events: EventLog
    agent: SignedAgent
    runs: Store[RunRecord]
    tasks: Store[TaskRecord]
    published: Published

    async def request(self) -> str:
        run_id = f"run-ann-{uuid.uuid4().hex[:12]}"
        data = RunRequested(
            run_id=run_id,
            agent="ext-announced",
            title="Decide whether the change may go ahead",
            launch=LaunchSource(kind="webhook", trigger_id="t-announce"),
            input={"change": "orders-api"},
            human=HumanPolicy(allowed_recipients=["user:alice"]),
        )
        await self.bus.publish(make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id))
        return run_id

    async def state(self, run_id: str, state: RunState) -> RunRecord:
        async def reached() -> RunRecord | None:
            found = await self.runs.get(run_id)
            return found.value if found is not None and found.value.state is state else None

        record: RunRecord = await eventually(reached, WAIT_S, f"run {run_id} {state.value}")
        return record

    async def parked(self, run_id: str, turn: int) -> None:
        """The run offered ``turn`` to its agent and parked on it."""
        await self.events.wait_for(
            "agent.task.offered", run_id=run_id, where=lambda e: e.data["turn"] == turn, timeout_s=WAIT_S
        )
        record = await self.state(run_id, RunState.WAITING_FOR_AGENT)
        assert record.waiting_request_id == f"{task_id_for(run_id)}.turn-{turn}"

    async def record(self, run_id: str) -> TaskRecord:
        found = await self.tasks.get(task_key(AGENT, task_id_for(run_id)))
        assert found is not None, f"no task record for {run_id}"
        return found.value

    async def collab_offered(self, run_id: str, turn: int) -> None:
        """agent-collab's task record of the run is at ``turn`` (its ``agent-collab-tasks`` consumer handled the
        offer: what its start reads as "a later turn offered")."""

        async def reached() -> bool:
            return (await self.record(run_id)).turn == turn

        await eventually(reached, WAIT_S, f"agent-collab's task record of {run_id} at turn {turn}")

    async def collab_sees(self, run_id: str, state: RunState) -> None:
        """agent-collab's saga projection shows the run in ``state`` (its ``agent-collab-runs`` consumer handled the
        run's event: what its start reads as "the run finished"), asked through get_collaborators."""

        async def shown() -> bool:
            query = CollaboratorsQuery(run_id=run_id).model_dump_json().encode()
            try:
                raw = await self.bus.nc.request(RPC_GET_COLLABORATORS, query, 10)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                return False
            reply = CollaboratorsReply.model_validate_json(raw.data)
            return any(c.run_id == run_id and c.status == state.value for c in reply.collaborators)

        await eventually(shown, WAIT_S, f"agent-collab's projection showing {run_id} {state.value}")


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Bus.connect(NatsSettings(url=stack.nats.url), name="test") as bus:
        events = await EventLog(bus.nc, since=datetime.now(UTC)).start()
        published = Published()

        async def seen(msg: Any) -> None:
            event = decode(msg.data)
            published.messages.append((event.type, event.id, event.runid))

        watch = await bus.nc.subscribe(subject_for("agent.task.*"), cb=seen)
        agent = SignedAgent(bus, AGENT, KEY, GRANTED, SESSION, WAIT_S)
        await agent.register()
        try:
            yield Client(
                bus,
                events,
                agent,
                await bus.store(BUCKET_RUNS, RunRecord),
                await bus.store(BUCKET_AGENT_TASKS, TaskRecord),
                published,
            )
        finally:
            await watch.unsubscribe()
            await events.stop()


async def test_an_action_whose_agent_collab_was_killed_before_announcing_it_wakes_the_run_at_the_next_start(
    stack: Stack, client: Client
) -> None:
    """kill -9 (``os._exit(137)`` at the seam) right after agent-collab committed the agent's result: the agent gets
    no reply and never sends the action again; nothing wakes the run (its budget is 600 s) until the next
    agent-collab starts and announces the action -- once, under the turn's event id -- and the run completes."""
    run_id = await client.request()
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)

    dying = await asyncio.to_thread(stack.restart_collab, crash_at="act:committed")
    with pytest.raises(nats.errors.TimeoutError):  # no reply: the process died right after its commit
        await client.agent.act(run_id, 1, "result", result="decided before agent-collab died")
    assert await asyncio.to_thread(dying.wait_stopped, WAIT_S) == CRASH_EXIT_STATUS, dying.log_tail()
    assert "dying at act:committed" in dying.log_tail()

    record = await client.record(run_id)
    assert ([a.kind for a in record.actions], record.state.value, record.acted_announced) == (
        ["result"],
        "completed",
        None,
    )
    await stays(lambda: not client.published.of("agent.task.acted", run_id), settle_s=1.0, what="no announcement")
    assert (await client.state(run_id, RunState.WAITING_FOR_AGENT)).state is RunState.WAITING_FOR_AGENT

    await asyncio.to_thread(stack.start, "agent-collab")
    (completed,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert completed.data["result"] == "decided before agent-collab died"
    (announced,) = client.events.of_type("agent.task.acted", run_id=run_id)
    assert (announced.data["turn"], announced.data["kind"]) == (1, "result")
    assert client.published.of("agent.task.acted", run_id) == [announced.id], "published once, at the start"
    assert [e.data["reason"] for e in client.events.of_type("run.resumed", run_id=run_id)] == ["agent_action"]
    assert (await client.record(run_id)).acted_announced == 1
    assert not client.events.of_type("run.failed", run_id=run_id)


async def _forget_announcement(client: Client, run_id: str) -> None:
    """The task's record as agent-collab wrote it before ``acted_announced`` existed: no announcement mark."""
    result = await client.tasks.modify(
        task_key(AGENT, task_id_for(run_id)), lambda cur: evolve(cur, acted_announced=None)
    )
    assert result.value.acted_announced is None


async def test_a_restart_announces_only_the_actions_no_run_has_taken_up(stack: Stack, client: Client) -> None:
    """Three tasks whose records carry no announcement mark when agent-collab starts: one whose run took its turn-1
    tool calls up and offered turn 2, one whose run completed with the agent's result, and one whose action a dead
    agent-collab stored and never announced (its run still parked on it). The start publishes ``agent.task.acted``
    for the last one only, marks all three, and a second restart publishes nothing."""
    moved_on, finished, lost = await client.request(), await client.request(), await client.request()
    for run_id in (moved_on, finished, lost):
        await client.parked(run_id, 1)
        await client.agent.take(run_id, 1)
    calls = [{"name": "get_input", "arguments": {}}]
    assert (await client.agent.act(moved_on, 1, "tool_calls", calls=calls))["accepted"]
    assert (await client.agent.act(finished, 1, "result", result="finished: go ahead"))["accepted"]
    await client.parked(moved_on, 2)
    await client.events.wait_for("run.completed", run_id=finished, timeout_s=WAIT_S)
    # the start reads agent-collab's own state, which its consumers update after those events: it must show both
    # runs took their actions up before agent-collab stops, or the start rightly announces them again
    await client.collab_offered(moved_on, 2)
    await client.collab_sees(finished, RunState.COMPLETED)

    assert stack.services["agent-collab"].terminate() == 0
    for run_id in (moved_on, finished):
        await _forget_announcement(client, run_id)
    body = TaskAction(
        agent_id=AGENT,
        protocol_version="1.0",
        task_id=task_id_for(lost),
        turn=1,
        action_id=f"{task_id_for(lost)}:1:result",
        kind="result",
        result="lost: go ahead",
    )  # what act() commits; the process that committed it died before its publish
    stored = await client.tasks.modify(
        task_key(AGENT, task_id_for(lost)), lambda cur: acted(cur, body, GRANTED, _now())
    )
    assert stored.changed
    assert stored.value.acted_announced is None
    before = {run_id: len(client.published.of("agent.task.acted", run_id)) for run_id in (moved_on, finished, lost)}
    assert before == {moved_on: 1, finished: 1, lost: 0}

    await asyncio.to_thread(stack.start, "agent-collab")  # ready only after its start-up announcement
    (completed,) = await client.events.wait_for("run.completed", run_id=lost, timeout_s=WAIT_S)
    assert completed.data["result"] == "lost: go ahead"
    await stays(
        lambda: [len(client.published.of("agent.task.acted", r)) for r in (moved_on, finished)] == [1, 1],
        settle_s=1.0,
        what="nothing taken up announced again",
    )
    assert len(client.published.of("agent.task.acted", lost)) == 1
    assert [(await client.record(r)).acted_announced for r in (moved_on, finished, lost)] == [1, 1, 1]

    count = len(client.published.messages)
    await asyncio.to_thread(stack.restart_collab)
    await stays(
        lambda: not [m for m in client.published.messages[count:] if m[0] == "agent.task.acted"],
        settle_s=1.0,
        what="a second start announces nothing",
    )
    # the run that moved on is undisturbed: its turn 2 is still the agent's
    await client.agent.take(moved_on, 2)
    last = await client.agent.act(moved_on, 2, "result", result="moved on: go ahead")
    assert last["accepted"], last
    (done,) = await client.events.wait_for("run.completed", run_id=moved_on, timeout_s=WAIT_S)
    assert done.data["result"] == "moved on: go ahead"
    for run_id in (moved_on, finished, lost):
        assert len(client.events.of_type("run.completed", run_id=run_id)) == 1
        assert not client.events.of_type("run.failed", run_id=run_id)


async def test_a_refused_handoff_gets_the_same_typed_refusal_when_sent_again(client: Client) -> None:
    """The agent is not granted ``handoff_to_agent``: its handoff is refused ``tool_not_allowed``; one without its
    document ``malformed_request``; one for a turn that is not open ``wrong_turn``. Each reply says why in a typed
    reason and a sentence, carries no ``child_run_id``, and the very same handoff sent again (signed afresh) gets
    the very same reply; each refusal is journaled (``agent.task.refused``, the malformed one too) as one event (one
    id however often it is published). The refusals
    store nothing: the turn is still open and the agent's result completes the run."""
    run_id = await client.request()
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)
    document = {"agent": "reviewer", "objective": "Finish the review of PR 42", "current_status": "read"}

    cases = [
        (1, {"handoff": document}, "tool_not_allowed", "handoff_to_agent"),
        (1, {}, "malformed_request", "handoff"),
        (2, {"handoff": document}, "wrong_turn", "turn 1"),
    ]
    for turn, fields, reason, mentioned in cases:
        first = await client.agent.act(run_id, turn, "handoff", **fields)
        again = await client.agent.act(run_id, turn, "handoff", **fields)
        assert first == again, (reason, first, again)
        assert (first["accepted"], first["duplicate"], first["refusal"]["reason"]) == (False, False, reason), first
        assert mentioned in first["refusal"]["detail"], first
        assert "child_run_id" not in first
        assert first["task_id"] == task_id_for(run_id)

    journaled = await client.events.wait_for("agent.task.refused", count=3, timeout_s=WAIT_S, where=_of_task(run_id))
    assert sorted(e.data["reason"] for e in journaled) == ["malformed_request", "tool_not_allowed", "wrong_turn"]
    assert all(e.data["kind"] == "handoff" and e.data["agent_id"] == AGENT for e in journaled)

    async def published_twice_each() -> bool:
        ids = [m[1] for m in client.published.messages if m[0] == "agent.task.refused" and m[1] in _ids(journaled)]
        return sorted(ids.count(i) for i in set(ids)) == [2, 2, 2]

    assert await eventually(published_twice_each, WAIT_S, "each refusal published twice, under one id")
    await stays(
        lambda: len([e for e in client.events.of_type("agent.task.refused") if _of_task(run_id)(e)]) == 3,
        settle_s=1.0,
        what="one journaled refusal per refused handoff",
    )

    record = await client.record(run_id)
    assert (record.state.value, record.turn, record.actions) == ("working", 1, [])
    assert (await client.agent.act(run_id, 1, "result", result="no handoff: go ahead"))["accepted"]
    (completed,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert completed.data["result"] == "no handoff: go ahead"
    assert not client.events.of_type("agent.handed_off", run_id=run_id)


def _of_task(run_id: str) -> Any:
    task_id = task_id_for(run_id)
    return lambda e: e.data.get("task_id") == task_id


def _ids(events: list[Any]) -> set[str]:
    return {e.id for e in events}


def _now() -> datetime:
    return datetime.now(UTC)
